"""The pinned pool: blocks are reused, never while the device still uses them, never reallocated per call."""

from __future__ import annotations

import numpy as np
import pytest

from asyncdist.gpu.pinned_pool import MIN_BLOCK_BYTES, PinnedPool, pool_for
from asyncdist.testing.fake_device import FakeAdapter, FakeDevice


def test_size_classes_and_reuse_after_the_event():
    adapter = FakeAdapter()
    pool = PinnedPool(adapter)
    dev = FakeDevice()
    stream = dev.new_stream()
    a = pool.acquire(100)
    assert a.size == MIN_BLOCK_BYTES and a.pinned.nbytes == MIN_BLOCK_BYTES
    assert pool.acquire(MIN_BLOCK_BYTES + 1).size == 2 * MIN_BLOCK_BYTES
    dev.launch(lambda: None, stream)  # the device is busy with the block until this runs
    busy = dev.record(stream)
    pool.release(a, busy)
    b = pool.acquire(10)  # a's copy may still run: a new block
    assert b is not a and adapter.pinned_allocations == 3
    dev.run_stream(stream)
    assert pool.acquire(10) is a  # done: reused
    assert (pool.allocations, pool.reuses) == (3, 1)


def test_trim_keeps_busy_blocks():
    adapter = FakeAdapter()
    pool = PinnedPool(adapter, max_cached_bytes=MIN_BLOCK_BYTES)
    dev = FakeDevice()
    stream = dev.new_stream()
    blocks = [pool.acquire(1) for _ in range(3)]
    hold = dev.hold(stream)
    busy = dev.record(stream)
    pool.release(blocks[0], busy)
    pool.release(blocks[1])
    pool.release(blocks[2])
    assert pool.cached_bytes == MIN_BLOCK_BYTES  # idle ones dropped, the busy one kept
    assert pool.acquire(1) not in blocks  # still busy: not handed out
    hold.release()
    dev.run_stream(stream)
    assert pool.acquire(1) is blocks[0]


@pytest.mark.parametrize("n", [2, 3])
def test_repeated_operations_reuse_blocks(worlds, n):
    """Twenty rounds of staged collectives and sends pin no more memory than the first."""

    async def body(r):
        x = r.put(np.arange(1000, dtype=np.float64))
        await r.g.all_reduce(x)
        out = r.empty(1000, np.float64)
        peer = (r.g.rank + 1) % n
        send = r.g.isend(x, peer)
        await r.g.recv(out, (r.g.rank - 1) % n)
        await send
        return r.get(out)

    pool = pool_for(worlds.get(n)[0].adapter)
    for _ in range(3):  # ranks share the pool: their interleaving settles the peak
        worlds.run(n, body)
    allocations, reuses = pool.allocations, pool.reuses
    for _ in range(20):
        for got in worlds.run(n, body):
            np.testing.assert_array_equal(got, n * np.arange(1000, dtype=np.float64))
    # Each round ends with every copy done (the reads wait for them), and a rank
    # has at most three blocks in flight: so at most 3n blocks, ever.
    assert pool.allocations <= 3 * n
    assert pool.allocations + pool.reuses == allocations + reuses + 20 * 3 * n
    if worlds.kind == "fake":  # deterministic interleaving: not one block more after warm-up
        assert pool.allocations == allocations

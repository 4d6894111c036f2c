"""An all_reduce of S bytes uses at most about S bytes of extra memory per rank.

Measured in each rank process with tracemalloc (NumPy reports its array
allocations to it), around one large all_reduce after a warm-up call, on
both payload paths: by memory between processes of one host, and inline.
The scratch pool is emptied first, so that the call allocates all the
memory it uses; and the pool itself keeps what it was given within bounds.
"""

from __future__ import annotations

import numpy as np
import pytest

from asyncdist.buffers.scratch import ScratchPool
from asyncdist.testing import spawn

SIZE = 16 << 20  # bytes: ring-sized, 16 chunks per rank pair
ALLOWED = 1.1 * SIZE  # "about S": S plus a tenth for headers, views and bookkeeping


def _all_reduce_peak(nbytes: int) -> tuple[int, bool]:
    """Extra bytes allocated at the peak of one all_reduce, and whether its result is right."""
    import tracemalloc

    import asyncdist as dist
    from asyncdist.buffers.scratch import pool

    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    data = np.empty(nbytes // 4, np.float32)
    data[:] = rank + 1
    dist.all_reduce(data)  # warm-up: first-call allocations are not the algorithm's
    data[:] = np.arange(data.size, dtype=np.float32) % 7 + rank
    dist.barrier()
    pool.clear()  # so that the call allocates, and the measure counts, all its scratch memory
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    dist.all_reduce(data)
    peak = tracemalloc.get_traced_memory()[1] - before
    tracemalloc.stop()
    expected = (np.arange(data.size, dtype=np.float32) % 7) * world + sum(range(world))
    correct = bool(np.array_equal(data, expected))
    dist.destroy_process_group()
    return peak, correct


@pytest.mark.parametrize(
    ("n", "by_memory"), [(2, "1"), (4, "1"), (2, "0")], ids=["2-ranks-by-memory", "4-ranks-by-memory", "2-ranks-inline"]
)
def test_all_reduce_peak_memory_is_about_its_size(n: int, by_memory: str) -> None:
    results = spawn(n, _all_reduce_peak, SIZE, env={"ASYNCDIST_CMA": by_memory})
    for rank, (peak, correct) in enumerate(results):
        assert correct, f"rank {rank}: wrong all_reduce result"
        assert peak <= ALLOWED, f"rank {rank} allocated {peak / SIZE:.2f} S at the peak of an all_reduce of S bytes"


def test_the_scratch_pool_reuses_blocks_and_keeps_no_more_than_its_bound() -> None:
    pool = ScratchPool(keep_bytes=3 << 20)
    first = pool.take("float32", 1 << 18)  # 1 MiB
    address = first.view.obj.__array_interface__["data"][0]
    pool.give_back(first)
    assert pool.kept_bytes == 1 << 20
    again = pool.take("float64", 1 << 17)  # the same 1 MiB block, reused
    assert again.view.obj.__array_interface__["data"][0] == address and pool.kept_bytes == 0
    smaller = pool.take_bytes(300 << 10)  # 1 MiB is over twice as large: a new block
    assert smaller.nbytes == 300 << 10 and smaller.__array_interface__["data"][0] != address
    for block in [again, *(pool.take_bytes(1 << 20) for _ in range(3))]:
        pool.give_back(block)
    assert pool.kept_bytes == 3 << 20  # four blocks given back, three kept (the oldest went)
    pool.give_back(np.empty(1 << 10, np.uint8))  # small blocks are not worth keeping
    assert pool.kept_bytes == 3 << 20
    pool.clear()
    assert pool.kept_bytes == 0

"""Point-to-point with device arrays through pinned staging, against NumPy (every kind of array)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from asyncdist.errors import InvalidRankError


def data(rank: int, n: int = 9, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng([5, rank]).standard_normal(n).astype(dtype)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_ring_device_to_device(worlds, n):
    async def body(r):
        me = r.g.rank
        got = r.empty(9, np.float32)
        send = r.g.isend(r.put(data(me)), (me + 1) % n, tag=3)
        sender = await r.g.irecv(got, (me - 1) % n, tag=3)
        await send
        return sender, r.get(got)

    for me, (sender, got) in enumerate(worlds.run(n, body)):
        assert sender == (me - 1) % n
        np.testing.assert_array_equal(got, data((me - 1) % n))


def test_device_host_mixes_and_any_source(worlds):
    async def body(r):
        me = r.g.rank
        if me == 0:
            await r.g.send(r.put(data(0)), 1)  # device -> host
            got = r.empty(9, np.float32)
            await r.g.recv(got, 1)  # host -> device
            anyone = r.empty(9, np.float32)
            sender = await r.g.recv(anyone)  # any source, into the device
            return r.get(got), sender, r.get(anyone)
        host = np.zeros(9, np.float32)
        await r.g.recv(host, 0)
        await r.g.send(data(1), 0)
        await r.g.send(r.put(data(7)), 0)
        return host

    (got, sender, anyone), host = worlds.run(2, body)
    np.testing.assert_array_equal(host, data(0))
    np.testing.assert_array_equal(got, data(1))
    assert sender == 1
    np.testing.assert_array_equal(anyone, data(7))


def test_sends_keep_their_order_while_a_copy_waits(worlds):
    """Messages between a pair with the same tag never overtake each other, even when
    the first one's copy off the device waits behind a busy stream."""

    async def body(r):
        if r.g.rank == 0:
            r.busy()
            works = [r.g.isend(r.put(data(1)), 1), r.g.isend(data(2), 1), r.g.isend(r.put(data(3)), 1)]
            await asyncio.gather(*works)
            return None
        outs = [r.empty(9, np.float32), np.zeros(9, np.float32), r.empty(9, np.float32)]
        for out in outs:
            await r.g.recv(out, 0)
        return [o if isinstance(o, np.ndarray) else r.get(o) for o in outs]

    _, outs = worlds.run(2, body)
    for k, out in enumerate(outs):
        np.testing.assert_array_equal(out, data(k + 1))


def test_work_wait_makes_the_waiting_stream_wait(worlds):
    """After the receive completes, a stream made current only then does not see the
    result until Work.wait() makes it wait (torch's rule for device results)."""

    async def body(r):
        if r.g.rank == 0:
            await r.g.send(r.put(data(4)), 1)
            return None
        got = r.empty(9, np.float32)
        work = r.g.irecv(got, 0)
        await work
        other = r.new_stream()
        with r.use(other):
            work.wait()  # done already: legal on the loop thread
            return r.get(got)

    _, got = worlds.run(2, body)
    np.testing.assert_array_equal(got, data(4))


def test_bad_peer_fails_at_once(worlds):
    async def body(r):
        x = r.put(data(0))
        with pytest.raises(InvalidRankError):
            r.g.isend(x, r.g.rank)
        with pytest.raises(InvalidRankError):
            r.g.isend(x, 5)

    worlds.run(2, body)

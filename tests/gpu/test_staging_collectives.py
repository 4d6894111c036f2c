"""Every collective on device arrays through pinned staging, against NumPy, on a fake device.

Runs on every kind of device array (see ``conftest.py``). Every input is
written by work queued on the rank's current stream (``Rank.put``), and
every result is read by work queued after the call (``Rank.get``). The fake
device runs work only when something waits for it, so there a copy that is
not ordered after the caller's stream reads zeros, and a result the caller's
stream does not wait for is not there: both fail the comparison with the
NumPy reference.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from asyncdist.errors import AsyncDistError, OperationTimeoutError, UnsupportedBufferError
from asyncdist.gpu import pinned_staging as staging
from asyncdist.reduce.op import ReduceOp, make_premul_sum

SIZES = [1, 2, 3, 4]


def data(rank: int, n: int = 7, dtype=np.float64) -> np.ndarray:
    return (np.random.default_rng([3, rank]).integers(-5, 6, n)).astype(dtype)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize(
    "op, dtype, combine",
    [
        (ReduceOp.SUM, np.float32, lambda xs: np.sum(xs, axis=0)),
        (ReduceOp.SUM, np.int64, lambda xs: np.sum(xs, axis=0)),
        (ReduceOp.MAX, np.int32, lambda xs: np.max(xs, axis=0)),
        (ReduceOp.PRODUCT, np.float64, lambda xs: np.prod(xs, axis=0)),
        (ReduceOp.AVG, np.float64, lambda xs: np.mean(xs, axis=0)),
        (make_premul_sum(0.5), np.float64, lambda xs: 0.5 * np.sum(xs, axis=0)),
        (ReduceOp.SUM, np.bool_, lambda xs: np.any(xs, axis=0)),
    ],
    ids=["sum-f32", "sum-i64", "max-i32", "prod-f64", "avg-f64", "premul-f64", "sum-bool"],
)
def test_all_reduce(worlds, n, op, dtype, combine):
    async def body(r):
        x = r.put(data(r.g.rank, dtype=dtype))
        await r.g.all_reduce(x, op)
        return r.get(x)

    expected = combine([data(k, dtype=dtype) for k in range(n)]).astype(dtype)
    for got in worlds.run(n, body):
        np.testing.assert_allclose(got, expected)


@pytest.mark.parametrize("n", SIZES)
def test_all_reduce_coalesced_and_shapes(worlds, n):
    shapes = [(3, 2), (), (0,), (5,)]

    async def body(r):
        xs = [r.put(data(r.g.rank + i, max(1, int(np.prod(s))))[: int(np.prod(s))].reshape(s)) for i, s in enumerate(shapes)]
        await r.g.all_reduce_coalesced(xs)
        return [r.get(x) for x in xs]

    for got in worlds.run(n, body):
        for i, s in enumerate(shapes):
            size = int(np.prod(s))
            expected = sum(data(k + i, max(1, size))[:size] for k in range(n)).reshape(s)
            np.testing.assert_array_equal(got[i], expected)


@pytest.mark.parametrize("n", SIZES)
def test_the_tensor_collectives_coalesced_over_two_dtypes(worlds, n):
    async def body(r):
        me = r.g.rank
        wholes = [r.put(np.zeros(3 * n)), r.put(np.zeros(2 * n, np.int32))]
        await r.g.all_gather_into_tensor_coalesced(wholes, [r.put(data(me, 3)), r.put(data(me, 2, np.int32))])
        parts = [r.put(np.zeros(3)), r.put(np.zeros(2, np.int32))]
        await r.g.reduce_scatter_tensor_coalesced(parts, [r.put(data(me, 3 * n)), r.put(data(me, 2 * n, np.int32))])
        return [r.get(w) for w in wholes], [r.get(p) for p in parts]

    for me, (gathered, scattered) in enumerate(worlds.run(n, body)):
        np.testing.assert_array_equal(gathered[0], np.concatenate([data(k, 3) for k in range(n)]))
        np.testing.assert_array_equal(gathered[1], np.concatenate([data(k, 2, np.int32) for k in range(n)]))
        np.testing.assert_array_equal(scattered[0], sum(data(k, 3 * n) for k in range(n))[3 * me:3 * me + 3])
        np.testing.assert_array_equal(scattered[1], sum(data(k, 2 * n, np.int32) for k in range(n))[2 * me:2 * me + 2])


@pytest.mark.parametrize("n", SIZES)
def test_broadcast_and_reduce_every_root(worlds, n):
    for root in range(n):

        async def body(r):
            b = r.put(data(r.g.rank))
            await r.g.broadcast(b, root)
            x = r.put(data(r.g.rank, dtype=np.int64))
            await r.g.reduce(x, root, ReduceOp.SUM)
            return r.get(b), r.get(x)

        for rank, (b, x) in enumerate(worlds.run(n, body)):
            np.testing.assert_array_equal(b, data(root))
            expected = sum(data(k, dtype=np.int64) for k in range(n)) if rank == root else data(rank, dtype=np.int64)
            np.testing.assert_array_equal(x, expected)  # left alone off the root


@pytest.mark.parametrize("n", SIZES)
def test_all_gathers(worlds, n):
    async def body(r):
        outs = [r.empty((2, 3), np.float32) for _ in range(n)]
        await r.g.all_gather(outs, r.put(data(r.g.rank, 6, np.float32).reshape(2, 3)))
        whole = r.empty((n * 2, 3), np.float32)
        await r.g.all_gather_into_tensor(whole, r.put(data(r.g.rank, 6, np.float32).reshape(2, 3)))
        return [r.get(o) for o in outs], r.get(whole)

    expected = [data(k, 6, np.float32).reshape(2, 3) for k in range(n)]
    for outs, whole in worlds.run(n, body):
        for k in range(n):
            np.testing.assert_array_equal(outs[k], expected[k])
        np.testing.assert_array_equal(whole, np.concatenate(expected))


@pytest.mark.parametrize("n", SIZES)
def test_gather_and_scatter_every_root(worlds, n):
    for root in range(n):

        async def body(r):
            me = r.g.rank
            slots = [r.empty(4, np.int16) for _ in range(n)] if me == root else None
            await r.g.gather(r.put(data(me, 4, np.int16)), slots, root)
            out = r.empty(4, np.int16)
            parts = [r.put(data(10 * me + k, 4, np.int16)) for k in range(n)] if me == root else None
            await r.g.scatter(out, parts, root)
            return ([r.get(s) for s in slots] if slots else None), r.get(out)

        for rank, (gathered, scattered) in enumerate(worlds.run(n, body)):
            if rank == root:
                for k in range(n):
                    np.testing.assert_array_equal(gathered[k], data(k, 4, np.int16))
            np.testing.assert_array_equal(scattered, data(10 * root + rank, 4, np.int16))


@pytest.mark.parametrize("n", SIZES)
def test_reduce_scatters(worlds, n):
    async def body(r):
        me = r.g.rank
        out = r.empty(3, np.float64)
        await r.g.reduce_scatter(out, [r.put(data(me * n + k, 3)) for k in range(n)], ReduceOp.SUM)
        out2 = r.empty(3, np.float64)
        await r.g.reduce_scatter_tensor(out2, r.put(data(me, 3 * n)), ReduceOp.MAX)
        return r.get(out), r.get(out2)

    for rank, (out, out2) in enumerate(worlds.run(n, body)):
        np.testing.assert_array_equal(out, sum(data(k * n + rank, 3) for k in range(n)))
        np.testing.assert_array_equal(out2, np.max([data(k, 3 * n) for k in range(n)], axis=0)[3 * rank : 3 * rank + 3])


@pytest.mark.parametrize("n", SIZES)
def test_all_to_alls(worlds, n):
    def part(src: int, dst: int) -> np.ndarray:  # sizes differ per pair
        return data(100 * src + dst, src + dst + 1)

    splits = [[(src + dst) % 3 for dst in range(n)] for src in range(n)]

    def rows(src: int) -> np.ndarray:
        return data(src, 2 * sum(splits[src])).reshape(-1, 2)

    async def body(r):
        me = r.g.rank
        outs = [r.empty(src + me + 1, np.float64) for src in range(n)]
        await r.g.all_to_all(outs, [r.put(part(me, dst)) for dst in range(n)])
        out_rows = sum(splits[src][me] for src in range(n))
        single = r.empty((out_rows, 2), np.float64)
        await r.g.all_to_all_single(single, r.put(rows(me)), [splits[src][me] for src in range(n)], splits[me])
        return [r.get(o) for o in outs], r.get(single)

    for me, (outs, single) in enumerate(worlds.run(n, body)):
        for src in range(n):
            np.testing.assert_array_equal(outs[src], part(src, me))
        pieces = []
        for src in range(n):
            start = sum(splits[src][:me])
            pieces.append(rows(src)[start : start + splits[src][me]])
        np.testing.assert_array_equal(single, np.concatenate(pieces))


@pytest.mark.parametrize("n", [2, 3])
def test_pipelined_chunks(worlds, n, monkeypatch):
    """Large element-wise calls run as one call per chunk; the last chunk is short."""
    monkeypatch.setattr(staging, "PIPELINE_CHUNK_BYTES", 64)
    count = 61  # 8-byte elements: 8 per chunk, 8 chunks, the last one of 5

    async def body(r):
        x = r.put(data(r.g.rank, count))
        await r.g.all_reduce(x, ReduceOp.AVG)
        b = r.put(data(r.g.rank, count))
        await r.g.broadcast(b, n - 1)
        s = r.put(data(r.g.rank, count))
        await r.g.reduce(s, 0)
        return r.get(x), r.get(b), r.get(s)

    everyone = [data(k, count) for k in range(n)]
    for rank, (x, b, s) in enumerate(worlds.run(n, body)):
        np.testing.assert_allclose(x, np.mean(everyone, axis=0))
        np.testing.assert_array_equal(b, everyone[-1])
        np.testing.assert_array_equal(s, np.sum(everyone, axis=0) if rank == 0 else everyone[rank])


@pytest.mark.parametrize("n", [2, 3])
def test_device_and_host_operands_mix(worlds, n):
    async def body(r):
        me = r.g.rank
        outs = [r.empty(5, np.int32) if k % 2 else np.zeros(5, np.int32) for k in range(n)]
        send = r.put(data(me, 5, np.int32)) if me % 2 else data(me, 5, np.int32)
        await r.g.all_gather(outs, send)
        return [o if isinstance(o, np.ndarray) else r.get(o) for o in outs]

    for got in worlds.run(n, body):
        for k in range(n):
            np.testing.assert_array_equal(got[k], data(k, 5, np.int32))


@pytest.mark.parametrize("n", [2, 3])
def test_call_order_kept_while_copies_wait(worlds, n):
    """A device call whose copy waits behind a long queue keeps its place before
    the host calls started after it: call numbers are taken at the first step."""

    async def body(r):
        me = r.g.rank
        if me == 0:
            r.busy()  # rank 0's stream is busy: its copy ends long after the others'
        x = r.put(data(me))
        y = data(me + 10)
        z = r.put(data(me + 20, 3))
        await asyncio.gather(r.g.all_reduce(x), r.g.all_reduce(y, ReduceOp.MAX), r.g.broadcast(z, 0))
        return r.get(x), y, r.get(z)

    for x, y, z in worlds.run(n, body):
        np.testing.assert_array_equal(x, sum(data(k) for k in range(n)))
        np.testing.assert_array_equal(y, np.max([data(k + 10) for k in range(n)], axis=0))
        np.testing.assert_array_equal(z, data(20, 3))


def test_unsupported_array_fails_every_rank_at_once(worlds):
    """A bad device operand raises on its rank, and the others' matching call fails
    with the relayed error instead of waiting for the timeout."""

    async def body(r):
        x = r.non_contiguous(data(r.g.rank)) if r.g.rank == 0 else r.put(data(r.g.rank))
        try:
            await r.g.all_reduce(x)
        except AsyncDistError as exc:
            return exc
        return None

    errors = worlds.run(2, body)
    assert isinstance(errors[0], UnsupportedBufferError) and "contiguous" in str(errors[0])
    assert isinstance(errors[1], AsyncDistError) and not isinstance(errors[1], OperationTimeoutError)
    assert "contiguous" in str(errors[1])

    async def after(r):  # the group is still usable
        x = r.put(data(r.g.rank))
        await r.g.all_reduce(x)
        return r.get(x)

    for got in worlds.run(2, after):
        np.testing.assert_array_equal(got, data(0) + data(1))

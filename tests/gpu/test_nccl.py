"""Every collective and p2p op through the NCCL path, against NumPy.

On the fake kind, NCCL is :mod:`asyncdist.testing.fake_nccl`, which keeps
NCCL's matching and ordering rules and runs an op only when every rank's
matching op reaches the head of its stream: these tests check the mapping of
each op to NCCL calls (group calls included) and its stream ordering, with
1 to 3 real ranks. On a GPU (torch and cupy kinds) the same bodies run on
``cupy.cuda.nccl`` with a one-rank communicator.
"""

from __future__ import annotations

import asyncio
import importlib.util

import numpy as np
import pytest

from asyncdist.errors import InvalidArgumentError
from asyncdist.gpu import use_nccl
from asyncdist.reduce.op import ReduceOp, make_premul_sum
from asyncdist.testing import fake_nccl

SIZES = [1, 2, 3]


def data(rank: int, n: int = 6, dtype=np.float64) -> np.ndarray:
    return np.random.default_rng([11, rank]).integers(-4, 5, n).astype(dtype)


@pytest.fixture(scope="module")
def nccl(worlds, kind):
    """``nccl(n, body)`` runs ``body(rank, group)`` on an NCCL subgroup of the size-n world."""
    groups: dict[int, list] = {}

    def run(n, body, *, fresh: bool = False):
        if kind != "fake" and n > 1:
            pytest.skip("NCCL refuses two ranks of one communicator on one GPU")
        if kind != "fake" and importlib.util.find_spec("cupy") is None:
            pytest.skip("the NCCL path needs CuPy")
        if fresh or n not in groups:

            async def make(r):
                sub = r.g.new_group()
                use_nccl(sub, r.g.store)
                return sub

            made = worlds.run(n, make)
            if fresh:
                return worlds.run(n, lambda r: body(r, made[r.g.rank]))
            groups[n] = made
        return worlds.run(n, lambda r: body(r, groups[n][r.g.rank]))

    return run


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize(
    "op, dtype, combine",
    [
        (ReduceOp.SUM, np.float32, lambda xs: np.sum(xs, axis=0)),
        (ReduceOp.MAX, np.int32, lambda xs: np.max(xs, axis=0)),
        (ReduceOp.MIN, np.int64, lambda xs: np.min(xs, axis=0)),
        (ReduceOp.PRODUCT, np.float64, lambda xs: np.prod(xs, axis=0)),
        (ReduceOp.AVG, np.float64, lambda xs: np.mean(xs, axis=0)),
        (make_premul_sum(0.25), np.float64, lambda xs: 0.25 * np.sum(xs, axis=0)),
        (ReduceOp.SUM, np.bool_, lambda xs: np.any(xs, axis=0)),
        (ReduceOp.PRODUCT, np.bool_, lambda xs: np.all(xs, axis=0)),
        (ReduceOp.SUM, np.complex64, lambda xs: np.sum(xs, axis=0)),
    ],
    ids=["sum-f32", "max-i32", "min-i64", "prod-f64", "avg-f64", "premul", "sum-bool", "prod-bool", "sum-c64"],
)
def test_all_reduce(nccl, n, op, dtype, combine):
    def values(k):
        v = data(k, dtype=np.float64)
        return (v + 1j * data(k + 50)).astype(dtype) if np.dtype(dtype).kind == "c" else v.astype(dtype)

    async def body(r, g):
        x = r.put(values(r.g.rank))
        await g.all_reduce(x, op)
        return r.get(x)

    expected = combine([values(k) for k in range(n)]).astype(dtype)
    for got in nccl(n, body):
        np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_avg_before_nccl_2_10_sums_then_scales(nccl, fake_only, monkeypatch):
    monkeypatch.setattr(fake_nccl, "VERSION", 20903)

    async def body(r, g):
        x = r.put(data(r.g.rank))
        await g.all_reduce(x, ReduceOp.AVG)
        y = r.empty(6, np.float64)
        await g.reduce_scatter_tensor(y, r.put(data(r.g.rank, 18)), ReduceOp.AVG)
        return r.get(x), r.get(y)

    for rank, (x, y) in enumerate(nccl(3, body, fresh=True)):
        np.testing.assert_allclose(x, np.mean([data(k) for k in range(3)], axis=0))
        np.testing.assert_allclose(y, np.mean([data(k, 18) for k in range(3)], axis=0)[6 * rank : 6 * rank + 6])


@pytest.mark.parametrize("n", SIZES)
def test_every_other_collective(nccl, n):
    async def body(r, g):
        me, out = r.g.rank, {}
        xs = [r.put(data(me + i, 3 + i)) for i in range(3)]
        await g.all_reduce_coalesced(xs, ReduceOp.MAX)
        out["coalesced"] = [r.get(x) for x in xs]
        for root in range(n):
            b = r.put(data(me, 5, np.int16))  # data movement: any dtype, as bytes
            await g.broadcast(b, root)
            s = r.put(data(me))
            await g.reduce(s, root, make_premul_sum(2.0))
            out[f"broadcast{root}"], out[f"reduce{root}"] = r.get(b), r.get(s)
            slots = [r.empty(4, np.float32) for _ in range(n)] if me == root else None
            await g.gather(r.put(data(me, 4, np.float32)), slots, root)
            out[f"gather{root}"] = [r.get(t) for t in slots] if slots else None
            recv = r.empty(4, np.uint8)
            parts = [r.put(data(20 * me + k, 4, np.uint8)) for k in range(n)] if me == root else None
            await g.scatter(recv, parts, root)
            out[f"scatter{root}"] = r.get(recv)
        outs = [r.empty(4, np.float64) for _ in range(n)]
        await g.all_gather(outs, r.put(data(me, 4)))
        out["all_gather"] = [r.get(t) for t in outs]
        whole = r.empty((n, 4), np.float64)
        await g.all_gather_into_tensor(whole, r.put(data(me, 4)))
        out["all_gather_into_tensor"] = r.get(whole)
        rs = r.empty(2, np.int32)
        await g.reduce_scatter(rs, [r.put(data(me * n + k, 2, np.int32)) for k in range(n)], ReduceOp.SUM)
        out["reduce_scatter"] = r.get(rs)
        wholes = [r.empty((n, 3), np.float64), r.empty((n, 2), np.int32)]
        await g.all_gather_into_tensor_coalesced(wholes, [r.put(data(me, 3)), r.put(data(me, 2, np.int32))])
        out["all_gather_coalesced"] = [r.get(w) for w in wholes]
        parts = [r.empty(3, np.float64), r.empty(2, np.int32)]
        await g.reduce_scatter_tensor_coalesced(parts, [r.put(data(me, 3 * n)), r.put(data(me, 2 * n, np.int32))])
        out["reduce_scatter_coalesced"] = [r.get(p) for p in parts]
        return out

    results = nccl(n, body)
    for me, out in enumerate(results):
        for i, got in enumerate(out["coalesced"]):
            np.testing.assert_array_equal(got, np.max([data(k + i, 3 + i) for k in range(n)], axis=0))
        for root in range(n):
            np.testing.assert_array_equal(out[f"broadcast{root}"], data(root, 5, np.int16))
            expected = 2 * sum(data(k) for k in range(n)) if me == root else data(me)
            np.testing.assert_array_equal(out[f"reduce{root}"], expected)
            if me == root:
                for k in range(n):
                    np.testing.assert_array_equal(out[f"gather{root}"][k], data(k, 4, np.float32))
            np.testing.assert_array_equal(out[f"scatter{root}"], data(20 * root + me, 4, np.uint8))
        for k in range(n):
            np.testing.assert_array_equal(out["all_gather"][k], data(k, 4))
        np.testing.assert_array_equal(out["all_gather_into_tensor"], np.stack([data(k, 4) for k in range(n)]))
        np.testing.assert_array_equal(out["reduce_scatter"], sum(data(k * n + me, 2, np.int32) for k in range(n)))
        np.testing.assert_array_equal(out["all_gather_coalesced"][0], np.stack([data(k, 3) for k in range(n)]))
        np.testing.assert_array_equal(out["all_gather_coalesced"][1], np.stack([data(k, 2, np.int32) for k in range(n)]))
        np.testing.assert_allclose(out["reduce_scatter_coalesced"][0],
                                   sum(data(k, 3 * n) for k in range(n))[3 * me:3 * me + 3])
        np.testing.assert_array_equal(out["reduce_scatter_coalesced"][1],
                                      sum(data(k, 2 * n, np.int32) for k in range(n))[2 * me:2 * me + 2])


@pytest.mark.parametrize("n", SIZES)
def test_all_to_alls(nccl, n):
    splits = [[(src * 2 + dst) % 3 for dst in range(n)] for src in range(n)]

    def rows(src):
        return data(src, 3 * sum(splits[src]), np.float32).reshape(-1, 3)

    async def body(r, g):
        me = r.g.rank
        outs = [r.empty(src + me + 1, np.int64) for src in range(n)]
        await g.all_to_all(outs, [r.put(data(10 * me + dst, me + dst + 1, np.int64)) for dst in range(n)])
        single = r.empty((sum(splits[s][me] for s in range(n)), 3), np.float32)
        await g.all_to_all_single(single, r.put(rows(me)), [splits[s][me] for s in range(n)], splits[me])
        return [r.get(o) for o in outs], r.get(single)

    for me, (outs, single) in enumerate(nccl(n, body)):
        for src in range(n):
            np.testing.assert_array_equal(outs[src], data(10 * src + me, src + me + 1, np.int64))
        expected = [rows(s)[sum(splits[s][:me]) : sum(splits[s][: me + 1])] for s in range(n)]
        np.testing.assert_array_equal(single, np.concatenate(expected))


@pytest.mark.parametrize("n", [2, 3])
def test_p2p_exchange_started_together_does_not_deadlock(nccl, n):
    """Every rank sends right, then receives from the left: issued one by one on one
    stream this deadlocks in NCCL (and in the fake); started together it is one group call."""

    async def body(r, g):
        me = r.g.rank
        got = r.empty(7, np.float32)
        send = g.isend(r.put(data(me, 7, np.float32)), (me + 1) % n)
        source = await g.irecv(got, (me - 1) % n)
        await send
        return source, r.get(got)

    for me, (source, got) in enumerate(nccl(n, body)):
        assert source == (me - 1) % n
        np.testing.assert_array_equal(got, data((me - 1) % n, 7, np.float32))


def test_blocking_p2p_in_turns(nccl):
    async def body(r, g):
        x = r.empty(3, np.float64)
        if r.g.rank == 0:
            await g.send(r.put(data(1, 3)), 1)
            await g.recv(x, 1)
        else:
            await g.recv(x, 0)
            await g.send(r.put(2 * r.get(x)), 0)
        return r.get(x)

    zero, one = nccl(2, body)
    np.testing.assert_array_equal(one, data(1, 3))
    np.testing.assert_array_equal(zero, 2 * data(1, 3))


def test_what_nccl_cannot_do_fails_locally_on_every_rank(nccl):
    async def body(r, g):
        errors = []
        for call in (
            lambda: g.all_reduce(r.put(data(0, dtype=np.int32)), ReduceOp.BAND),
            lambda: g.all_reduce(r.put(data(0, dtype=np.complex64)), ReduceOp.MAX),
            lambda: g.all_reduce(r.put(data(0, dtype=np.int16))),
            lambda: g.recv(r.empty(3, np.float64)),  # any source
        ):
            try:
                await call()
            except InvalidArgumentError as exc:
                errors.append(str(exc))
        host = data(r.g.rank)
        await g.all_reduce(host)  # host arrays of an NCCL group take the host path
        x = r.put(data(r.g.rank))
        await g.all_reduce(x)  # the communicator is still fine
        return errors, r.get(x), host

    for errors, x, host in nccl(1, body):
        assert len(errors) == 4
        np.testing.assert_array_equal(host, data(0))
        assert "bitwise" in errors[0] and "complex" in errors[1] and "int16" in errors[2] and "any source" in errors[3]
        np.testing.assert_array_equal(x, data(0))


def test_ops_keep_their_order_while_the_communicator_is_made(nccl):
    """The first op waits for the communicator; ops started after it wait their turn."""

    async def body(r, g):
        xs = [r.put(data(r.g.rank + i)) for i in range(4)]
        await asyncio.gather(*(g.all_reduce(x, op) for x, op in zip(xs, [ReduceOp.SUM, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.SUM])))
        return [r.get(x) for x in xs]

    for got in nccl(3, body, fresh=True):
        for i, reduce in enumerate([np.sum, np.max, np.min, np.sum]):
            np.testing.assert_array_equal(got[i], reduce([data(k + i) for k in range(3)], axis=0))

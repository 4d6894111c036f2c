"""Every algorithm of asyncdist.collectives on the in-memory channel, against NumPy.

Hypothesis draws the group size (1 to 9), the element count (0 and 1
included), the dtype (every one asyncdist carries; for reductions every one
with arithmetic, torch's when torch is installed), the op (where it is
defined), the root, the slot sizes, which links carry payloads by memory,
the ring's two chunk sizes (patched down to a few bytes, so that slots
arrive in one size of chunk and leave in another) and the size of the
pieces a fold is handed. Each rank's input is made from a seed; the result
is computed here on the gathered inputs, with NumPy, in float64 or
complex128 and rounded once to the dtype.

Inputs are small integers (or, for float8, -1, 0 and 1; for float8_e8m0fnu,
which has neither zero nor sign, 0.5, 1 and 2) chosen so that every partial
result of every combining order is exact: a float result then equals the
correctly rounded exact one, whichever algorithm combined it. Only AVG
rounds twice (the sum, then the quotient) and is compared within one unit
in the last place. Integers take any value: wrap-around is the same in
every order. float8_e8m0fnu has no mantissa, so a sum depends on its order;
its SUM, AVG and PREMUL_SUM are left to tests/test_ops.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncdist.buffers.host import ITEMSIZES, HostBuffer
from asyncdist.collectives import barrier, chain, direct, doubling, halving, ring, select, tree
from asyncdist.collectives.in_memory import InMemoryChannel, run_ranks
from asyncdist.errors import InvalidArgumentError
from asyncdist.reduce import kernels as ops
from asyncdist.reduce.kernels import ReduceOp

try:
    import torch
except ImportError:
    torch = None

pytestmark = pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental:UserWarning")

INTS = [f"{sign}int{bits}" for sign in ("", "u") for bits in (8, 16, 32, 64)]
FLOAT8 = ["float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu"]
FLOATS = ["float16", "float32", "float64"] + (["bfloat16", *FLOAT8] if torch else [])
COMPLEX = ["complex64", "complex128"] + (["complex32"] if torch else [])
# Relative spacing at 1: the AVG tolerance.
EPS = {"float16": 2.0**-10, "float32": 2.0**-23, "float64": 2.0**-52, "bfloat16": 2.0**-7, "complex32": 2.0**-10}
EPS.update({"complex64": EPS["float32"], "complex128": EPS["float64"], **{d: 2.0**-3 for d in FLOAT8[:2]}})
EPS.update({d: 2.0**-2 for d in FLOAT8[2:]})

E8M0_SUMS = {("float8_e8m0fnu", op) for op in ("SUM", "AVG", "PREMUL_SUM")}
OPS = ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "AVG", "PREMUL_SUM"]
FACTORS = {"real": [0.5, 2.0, -1.0], "complex": [0.5, -1.0, 1 + 1j]}  # exact in every dtype


def is_defined(op: str, dtype: str) -> bool:
    """asyncdist.reduce.op's rules, restated independently of check_op."""
    if (dtype, op) in E8M0_SUMS:
        return False  # defined, but not reproducible across orders: see the module docstring
    if op in ("BAND", "BOR", "BXOR"):
        return dtype == "bool" or dtype in INTS
    if op in ("AVG", "PREMUL_SUM"):
        return dtype in FLOATS or dtype in COMPLEX
    return op in ("SUM", "PRODUCT") or dtype not in COMPLEX


PAIRS = [(op, d) for op in OPS for d in ["bool", *INTS, *FLOATS, *COMPLEX] if is_defined(op, d)]


# -- values: each dtype's data as exact NumPy numbers, and as bytes ------------


def make_values(seed: int, rank: int, count: int, dtype: str, op: str) -> np.ndarray:
    """Rank ``rank``'s input: bool or integers as themselves, floats as float64, complex as complex128."""
    rng = np.random.default_rng([seed, rank])
    if dtype == "bool":
        return rng.integers(0, 2, count).astype(bool)
    if dtype in INTS:
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, count, dtype=dtype, endpoint=True)
    if dtype == "float8_e8m0fnu":
        return rng.choice([0.5, 1.0, 2.0], count)
    if dtype in FLOAT8:
        return rng.choice([-1.0, 1.0] if op == "PRODUCT" else [-1.0, 0.0, 1.0], count)
    if op == "PRODUCT":
        choices = [1, -1, 1j, -1j, 1 + 1j] if dtype in COMPLEX else [-2.0, -1.0, 1.0, 2.0]
        return rng.choice(np.array(choices), count)
    real = rng.integers(-4, 5, count).astype(np.float64)
    return real + 1j * rng.integers(-4, 5, count) if dtype in COMPLEX else real


def to_bytes(values: np.ndarray, dtype: str) -> bytes:
    if not values.size:  # (torch cannot view an empty tensor as bytes)
        return b""
    if dtype == "complex32":  # pairs of float16
        return np.stack([values.real, values.imag], axis=-1).astype(np.float16).tobytes()
    if dtype in ("bfloat16", *FLOAT8):
        return torch.from_numpy(values).to(getattr(torch, dtype)).view(torch.uint8).numpy().tobytes()
    return values.astype(dtype).tobytes()


def from_bytes(data: bytes | memoryview, dtype: str) -> np.ndarray:
    raw = np.frombuffer(data, np.uint8)
    if dtype == "complex32":
        pairs = raw.view(np.float16).astype(np.float64).reshape(-1, 2)
        return pairs[:, 0] + 1j * pairs[:, 1]
    if dtype in ("bfloat16", *FLOAT8):
        return torch.from_numpy(raw.copy()).view(getattr(torch, dtype)).to(torch.float64).numpy() if raw.size else np.zeros(0)
    array = raw.view(dtype)
    return array.astype(np.complex128 if dtype in COMPLEX else np.float64) if dtype in FLOATS + COMPLEX else array


def buffer(data: bytes, dtype: str) -> HostBuffer:
    """A writable buffer of its own, holding ``data``."""
    return HostBuffer(memoryview(bytearray(data)), dtype, (len(data) // ITEMSIZES[dtype],))


def reference(op: str, inputs: list[np.ndarray], dtype: str, factor: complex) -> np.ndarray:
    """The reduction of ``inputs`` (``make_values``'s), as values of ``dtype`` (AVG: exact)."""
    stack = np.stack(inputs)
    if dtype == "bool":
        logical = {"SUM": np.logical_or, "MAX": np.logical_or, "BOR": np.logical_or, "BXOR": np.logical_xor}
        return (logical.get(op) or np.logical_and).reduce(stack, axis=0)
    if dtype in INTS:
        ufunc = {"SUM": np.add, "PRODUCT": np.multiply, "MIN": np.minimum, "MAX": np.maximum}
        ufunc.update({"BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor})
        return ufunc[op].reduce(stack, axis=0, dtype=dtype)
    exact = {
        "SUM": lambda: stack.sum(axis=0),
        "PRODUCT": lambda: stack.prod(axis=0),
        "MIN": lambda: stack.min(axis=0),
        "MAX": lambda: stack.max(axis=0),
        "PREMUL_SUM": lambda: (factor * stack).sum(axis=0),
        "AVG": lambda: stack.sum(axis=0) / len(inputs),
    }[op]()
    return exact if op == "AVG" else from_bytes(to_bytes(exact, dtype), dtype)


def assert_reduced(result: np.ndarray, expected: np.ndarray, op: str, dtype: str) -> None:
    if op == "AVG":
        assert np.all(np.abs(result - expected) <= EPS[dtype] * np.abs(expected)), (result, expected)
    else:
        np.testing.assert_array_equal(result, expected)


def make_op(op: str, factor: complex) -> Any:
    return ops.make_premul_sum(factor) if op == "PREMUL_SUM" else getattr(ReduceOp, op)


# -- running -----------------------------------------------------------------

group_sizes = st.integers(1, 9)
counts = st.integers(0, 41)
seeds = st.integers(0, 2**32 - 1)


@st.composite
def networks(draw: st.DrawFn) -> dict[str, Any]:
    """The links that carry payloads by memory, the ring's chunk sizes and the fold pieces."""
    links = draw(st.integers(0, 2**81 - 1))  # a bit per (src, dst) of up to 9 ranks
    return {
        "links": links,
        "by_memory": lambda src, dst: bool(links >> (src * 9 + dst) & 1),
        "fold_piece_bytes": draw(st.none() | st.integers(1, 32)),
        "chunk": draw(st.integers(1, 48)),
        "memory_chunk": draw(st.integers(1, 48)),
    }


def run(n: int, net: dict[str, Any], per_rank: Callable[[InMemoryChannel], Any]) -> list[Any]:
    """Run ``per_rank`` on n in-memory ranks with ``net``'s links and chunk sizes."""
    with mock.patch.object(ring, "CHUNK_BYTES", net["chunk"]), mock.patch.object(ring, "MEMORY_CHUNK_BYTES", net["memory_chunk"]), \
            mock.patch.object(chain, "MIN_CHUNK_BYTES", net["chunk"]), mock.patch.object(chain, "BALANCE_BYTES", net["memory_chunk"]):
        # A few ms per example; a deadlock fails at once, anything else hung gives up in 5 s.
        return asyncio.run(run_ranks(n, per_rank, by_memory=net["by_memory"], fold_piece_bytes=net["fold_piece_bytes"], timeout=5))


def slot_sizes(draw: st.DrawFn, n: int, count: int) -> list[int]:
    """``count`` elements cut into ``n`` slots of drawn sizes (some may be empty)."""
    cuts = sorted(draw(st.lists(st.integers(0, count), min_size=n - 1, max_size=n - 1)))
    bounds = [0, *cuts, count]
    return [b - a for a, b in zip(bounds, bounds[1:])]


def cut(buf: HostBuffer, sizes: Sequence[int]) -> list[HostBuffer]:
    starts = np.cumsum([0, *sizes])
    return [buf.elements(int(a), int(b)) for a, b in zip(starts, starts[1:])]


# -- reductions --------------------------------------------------------------

ALL_REDUCES = {
    f.__qualname__: f
    for f in (doubling.recursive_doubling_all_reduce, ring.ring_all_reduce, halving.halving_doubling_all_reduce)
}
ALL_REDUCES["select.all_reduce"] = select.all_reduce
REDUCES = {f.__qualname__: f for f in (tree.binomial_reduce, ring.ring_reduce)}
REDUCES["select.reduce"] = select.reduce
REDUCTIONS = [*ALL_REDUCES, *REDUCES, "ring_reduce_scatter"]


@st.composite
def reductions(draw: st.DrawFn) -> dict[str, Any]:
    op, dtype = draw(st.sampled_from(PAIRS))
    n, count = draw(group_sizes), draw(counts)
    return {
        "op": op, "dtype": dtype, "n": n, "count": count,
        "root": draw(st.integers(0, n - 1)),
        "factor": draw(st.sampled_from(FACTORS["complex" if dtype in COMPLEX else "real"])),
        "slots": slot_sizes(draw, n, count),
        "small": draw(st.integers(0, 256)),  # select's threshold, so that it makes both choices
    }  # fmt: skip


def check_reduction(algorithm: str, call: dict[str, Any], net: dict[str, Any], seed: int) -> None:
    """Run one of REDUCTIONS as a collective does (prepare, algorithm, finish) and check it."""
    n, dtype, name, root = call["n"], call["dtype"], call["op"], call["root"]
    inputs = [make_values(seed, r, call["count"], dtype, name) for r in range(n)]
    bufs = [buffer(to_bytes(x, dtype), dtype) for x in inputs]
    op = make_op(name, call["factor"])

    async def reduction(channel: InMemoryChannel) -> None:
        buf = bufs[channel.rank]
        ops.prepare(op, buf)
        if algorithm in ALL_REDUCES:
            await ALL_REDUCES[algorithm](channel, buf, op)
        elif algorithm in REDUCES:
            await REDUCES[algorithm](channel, buf, root, op)
        else:
            await ring.ring_reduce_scatter(channel, cut(buf, call["slots"]), op)

    with mock.patch.object(select, "SMALL_MESSAGE_BYTES", call["small"]):
        run(n, net, reduction)
    expected = reference(name, inputs, dtype, call["factor"])
    starts = np.cumsum([0, *call["slots"]])
    results = {root: (0, call["count"])} if algorithm in REDUCES else {
        r: (0, call["count"]) if algorithm in ALL_REDUCES else (int(starts[r]), int(starts[r + 1])) for r in range(n)
    }  # fmt: skip
    for r, (a, b) in results.items():
        part = bufs[r].elements(a, b)
        ops.finish(op, part, n)
        assert_reduced(from_bytes(part.view, dtype), expected[a:b], name, dtype)


@pytest.mark.parametrize("algorithm", REDUCTIONS)
@settings(max_examples=150, deadline=None)
@given(call=reductions(), net=networks(), seed=seeds)
def test_reduction(algorithm: str, call: dict[str, Any], net: dict[str, Any], seed: int) -> None:
    check_reduction(algorithm, call, net, seed)


MIXED = {"links": None, "by_memory": lambda src, dst: src % 2 == 0, "fold_piece_bytes": 4, "chunk": 5, "memory_chunk": 7}


@pytest.mark.parametrize("algorithm", REDUCTIONS)
def test_reduction_of_every_op_on_every_dtype(algorithm: str) -> None:
    for op, dtype in PAIRS:
        factor = 1 + 1j if dtype in COMPLEX else 0.5
        call = {"op": op, "dtype": dtype, "n": 5, "count": 13, "root": 3, "factor": factor, "slots": [4, 0, 3, 3, 3], "small": 40}
        check_reduction(algorithm, call, MIXED, seed=len(op) * 31 + len(dtype))


@pytest.mark.parametrize("algorithm", REDUCTIONS)
def test_reduction_on_every_group_size_to_every_root(algorithm: str) -> None:
    for n in range(1, 10):
        for root in range(n):
            call = {"op": "SUM", "dtype": "float32", "n": n, "count": 2 * n + 1, "root": root, "factor": 1.0, "small": 40}
            check_reduction(algorithm, {**call, "slots": [3] + [2] * (n - 1)}, MIXED, seed=n)


def test_the_restated_op_rules_agree_with_check_op() -> None:
    for op in OPS:
        for dtype in ["bool", *INTS, *FLOATS, *COMPLEX]:
            try:
                ops.check_op(make_op(op, 2.0), dtype)
            except InvalidArgumentError:
                defined = False
            else:
                defined = True
            assert defined == (is_defined(op, dtype) or (dtype, op) in E8M0_SUMS), (op, dtype)


# -- data movement: every dtype, compared byte for byte ------------------------

move_dtypes = st.sampled_from(sorted(ITEMSIZES))


def random_bytes(seed: int, rank: int, count: int, dtype: str) -> bytes:
    return np.random.default_rng([seed, rank, 1]).bytes(count * ITEMSIZES[dtype])


BROADCASTS = {"binomial": tree.binomial_broadcast, "chain": chain.chain_broadcast, "select": select.broadcast}


def check_broadcast(algorithm: str, n: int, root: int, count: int, dtype: str, net: dict[str, Any], seed: int) -> None:
    bufs = [buffer(random_bytes(seed, r, count, dtype), dtype) for r in range(n)]
    sent = bytes(bufs[root].view)

    async def broadcast(channel: InMemoryChannel) -> None:
        await BROADCASTS[algorithm](channel, bufs[channel.rank], root)

    run(n, net, broadcast)
    assert [bytes(buf.view) for buf in bufs] == [sent] * n


def check_gather_and_scatter(n: int, root: int, count: int, dtype: str, net: dict[str, Any], seed: int) -> None:
    sends = [buffer(random_bytes(seed, r, count, dtype), dtype) for r in range(n)]
    gathered = [buffer(bytes(count * ITEMSIZES[dtype]), dtype) for _ in range(n)]
    scattered = [buffer(bytes(count * ITEMSIZES[dtype]), dtype) for _ in range(n)]

    async def gather_then_scatter(channel: InMemoryChannel) -> None:
        rank = channel.rank
        await direct.direct_gather(channel, sends[rank], gathered if rank == root else None, root)
        await direct.direct_scatter(channel, sends if rank == root else None, scattered[rank], root)

    run(n, net, gather_then_scatter)
    assert [bytes(b.view) for b in gathered] == [bytes(b.view) for b in sends]
    assert [bytes(b.view) for b in scattered] == [bytes(b.view) for b in sends]


@pytest.mark.parametrize("algorithm", sorted(BROADCASTS))
@settings(max_examples=100, deadline=None)
@given(
    n=group_sizes, data=st.data(), count=counts, dtype=move_dtypes,
    small=st.integers(0, 256), min_ranks=st.integers(1, 10), net=networks(), seed=seeds,
)  # fmt: skip
def test_broadcast(algorithm: str, n: int, data: st.DataObject, count: int, dtype: str, small: int, min_ranks: int, net: dict[str, Any], seed: int) -> None:
    root = data.draw(st.integers(0, n - 1))
    with mock.patch.object(select, "SMALL_MESSAGE_BYTES", small), mock.patch.object(select, "CHAIN_BROADCAST_MIN_RANKS", min_ranks):
        check_broadcast(algorithm, n, root, count, dtype, net, seed)


@settings(max_examples=150, deadline=None)
@given(n=group_sizes, data=st.data(), count=counts, dtype=move_dtypes, net=networks(), seed=seeds)
def test_direct_gather_and_scatter(n: int, data: st.DataObject, count: int, dtype: str, net: dict[str, Any], seed: int) -> None:
    check_gather_and_scatter(n, data.draw(st.integers(0, n - 1)), count, dtype, net, seed)


def test_movement_on_every_group_size_from_every_root() -> None:
    for n in range(1, 10):
        for root in range(n):
            for algorithm in BROADCASTS:
                check_broadcast(algorithm, n, root, 2 * n + 1, "int16", MIXED, seed=n)
            check_gather_and_scatter(n, root, 3, "bfloat16", MIXED, seed=n)


@settings(max_examples=150, deadline=None)
@given(n=group_sizes, data=st.data(), count=counts, dtype=move_dtypes, net=networks(), seed=seeds)
def test_ring_all_gather(n: int, data: st.DataObject, count: int, dtype: str, net: dict[str, Any], seed: int) -> None:
    sizes = slot_sizes(data.draw, n, count)
    owned = [cut(buffer(random_bytes(seed, r, count, dtype), dtype), sizes)[r] for r in range(n)]
    bufs = [buffer(b"\xab" * count * ITEMSIZES[dtype], dtype) for _ in range(n)]
    for r in range(n):
        cut(bufs[r], sizes)[r].view[:] = owned[r].view

    async def all_gather(channel: InMemoryChannel) -> None:
        await ring.ring_all_gather(channel, cut(bufs[channel.rank], sizes))

    run(n, net, all_gather)
    assert [bytes(buf.view) for buf in bufs] == [b"".join(bytes(o.view) for o in owned)] * n


@settings(max_examples=150, deadline=None)
@given(n=group_sizes, data=st.data(), dtype=move_dtypes, net=networks(), seed=seeds)
def test_direct_all_to_all(n: int, data: st.DataObject, dtype: str, net: dict[str, Any], seed: int) -> None:
    counts_between = data.draw(st.lists(st.lists(st.integers(0, 5), min_size=n, max_size=n), min_size=n, max_size=n))
    sends = [[buffer(random_bytes(seed, i * n + j, counts_between[i][j], dtype), dtype) for j in range(n)] for i in range(n)]
    receives = [[buffer(bytes(counts_between[i][j] * ITEMSIZES[dtype]), dtype) for i in range(n)] for j in range(n)]

    async def all_to_all(channel: InMemoryChannel) -> None:
        await direct.direct_all_to_all(channel, sends[channel.rank], receives[channel.rank])

    run(n, net, all_to_all)
    for i in range(n):
        for j in range(n):
            assert bytes(receives[j][i].view) == bytes(sends[i][j].view), (i, j)


@settings(max_examples=60, deadline=None)
@given(n=group_sizes, delays=st.lists(st.integers(0, 12), min_size=9, max_size=9), net=networks())
def test_dissemination_barrier_returns_only_once_every_rank_entered(n: int, delays: list[int], net: dict[str, Any]) -> None:
    entered: set[int] = set()

    async def arrive_late(channel: InMemoryChannel) -> frozenset[int]:
        for _ in range(delays[channel.rank]):  # other ranks run meanwhile
            await asyncio.sleep(0)
        entered.add(channel.rank)
        await barrier.dissemination_barrier(channel)
        return frozenset(entered)

    assert run(n, net, arrive_late) == [frozenset(range(n))] * n

"""Soak: many random collectives and point-to-point messages on random groups.

Four ranks in one loop (``local_world``) run a random plan (the same seed on
every rank) of mixed operations on random subgroups, several at a time, and
every result is checked against NumPy. After a warm-up, memory must stay
flat (RSS growth under 10 %), and no task, socket or matching entry may be
left behind. The short run is part of every test run; the long one
(thousands of operations) is behind ``-m soak``.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import os
import resource
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pytest

from asyncdist.reduce.kernels import ReduceOp
from asyncdist.group.process_group import ProcessGroup
from asyncdist.testing import local_world

N = 4
SHORT_OPS, LONG_OPS = 1000, 20000
SIZES = [1, 3, 17, 1000, 9000, 20000]  # 9000 float64 and up: the ring algorithms
DTYPES = ["float64", "float32", "int64", "int32"]
REDUCTIONS = {"sum": (ReduceOp.SUM, np.sum), "max": (ReduceOp.MAX, np.max), "min": (ReduceOp.MIN, np.min),
              "product": (ReduceOp.PRODUCT, np.prod)}
KINDS = ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "gather", "scatter",
         "barrier", "all_gather_object", "send_recv", "isend_irecv_any"]


@dataclass(frozen=True, slots=True)
class Step:
    """One operation of the plan: what, on which group, with which data."""

    index: int
    kind: str
    group: int
    size: int
    dtype: str
    reduction: str
    root: int
    peer: int
    seed: int


def _data(step: Step, member: int, count: int | None = None) -> np.ndarray:
    """Member ``member``'s input: small integers (exact in every dtype and op)."""
    rng = np.random.default_rng((step.seed, member))
    low, high = (1, 3) if step.reduction == "product" else (-4, 5)
    return rng.integers(low, high, size=count or step.size).astype(step.dtype)


def _plan(rng: np.random.Generator, n_ops: int, sizes: list[int]) -> list[list[Step]]:
    """Rounds of 1 to 3 steps, run concurrently within a round."""
    rounds, index = [], 0
    while index < n_ops:
        batch = []
        for _ in range(int(rng.integers(1, 4))):
            kind = KINDS[index % len(KINDS)] if index < len(KINDS) else str(rng.choice(KINDS))
            group = int(rng.integers(len(sizes)))
            while kind in ("send_recv", "isend_irecv_any") and sizes[group] < 2:
                group = int(rng.integers(len(sizes)))
            k = sizes[group]
            root = int(rng.integers(k))
            peer = (root + 1 + int(rng.integers(k - 1))) % k if k > 1 else root
            size = int(rng.choice(SIZES))
            # A product of thousands of small ints overflows; keep products short.
            reduction = str(rng.choice(list(REDUCTIONS))) if size <= 20 else str(rng.choice(["sum", "max", "min"]))
            batch.append(Step(index, kind, group, size, str(rng.choice(DTYPES)), reduction, root, peer,
                              int(rng.integers(1 << 31))))
            index += 1
        rounds.append(batch)
    return rounds


async def _run(step: Step, g: ProcessGroup) -> Callable[[], None] | None:
    """Run ``step`` as group rank ``g.rank``; return a check (or None if not involved)."""
    k, me = g.size, g.rank
    if step.kind == "all_reduce":
        op, ref = REDUCTIONS[step.reduction]
        x = _data(step, me)
        await g.all_reduce(x, op)
        want = ref(np.stack([_data(step, i) for i in range(k)]), axis=0).astype(step.dtype)
        return lambda: np.testing.assert_array_equal(x, want)
    if step.kind == "broadcast":
        x = _data(step, me)
        await g.broadcast(x, step.root)
        return lambda: np.testing.assert_array_equal(x, _data(step, step.root))
    if step.kind == "reduce":
        x = _data(step, me)
        await g.reduce(x, step.root, ReduceOp.SUM)
        want = np.sum([_data(step, i) for i in range(k)], axis=0).astype(step.dtype) if me == step.root \
            else _data(step, me)
        return lambda: np.testing.assert_array_equal(x, want)
    if step.kind == "all_gather":
        out = np.empty(step.size * k, step.dtype)
        await g.all_gather_into_tensor(out, _data(step, me))
        return lambda: np.testing.assert_array_equal(out, np.concatenate([_data(step, i) for i in range(k)]))
    if step.kind == "reduce_scatter":
        out = np.empty(step.size, step.dtype)
        await g.reduce_scatter_tensor(out, _data(step, me, step.size * k))
        total = np.sum([_data(step, i, step.size * k) for i in range(k)], axis=0).astype(step.dtype)
        return lambda: np.testing.assert_array_equal(out, total[me * step.size:(me + 1) * step.size])
    if step.kind == "all_to_all":
        out = np.empty(step.size * k, step.dtype)
        await g.all_to_all_single(out, _data(step, me, step.size * k))
        want = np.concatenate([_data(step, i, step.size * k)[me * step.size:(me + 1) * step.size] for i in range(k)])
        return lambda: np.testing.assert_array_equal(out, want)
    if step.kind == "gather":
        slots = [np.empty(step.size, step.dtype) for _ in range(k)] if me == step.root else None
        await g.gather(_data(step, me), slots, step.root)
        if slots is None:
            return lambda: None
        return lambda: [np.testing.assert_array_equal(s, _data(step, i)) for i, s in enumerate(slots)]
    if step.kind == "scatter":
        out = np.empty(step.size, step.dtype)
        parts = [_data(step, i) for i in range(k)] if me == step.root else None
        await g.scatter(out, parts, step.root)
        return lambda: np.testing.assert_array_equal(out, _data(step, me))
    if step.kind == "barrier":
        await g.barrier()
        return lambda: None
    if step.kind == "all_gather_object":
        objects: list[Any] = [None] * k
        await g.all_gather_object(objects, {"step": step.index, "member": me, "data": _data(step, me, 3).tolist()})
        want = [{"step": step.index, "member": i, "data": _data(step, i, 3).tolist()} for i in range(k)]
        return lambda: objects == want or pytest.fail(f"{objects} != {want}")
    # Point to point between group ranks root -> peer, with the step's index as tag.
    if me == step.root:
        x = _data(step, me)
        if step.kind == "send_recv":
            await g.send(x, step.peer, tag=step.index)
        else:
            await g.isend(x, step.peer, tag=step.index)
        return lambda: None
    if me == step.peer:
        out = np.empty(step.size, step.dtype)
        if step.kind == "send_recv":
            sender = await g.recv(out, step.root, tag=step.index)
        else:
            sender = await g.irecv(out, None, tag=step.index)
        return lambda: (np.testing.assert_array_equal(out, _data(step, step.root)), sender == step.root
                        or pytest.fail(f"sender {sender}"))
    return None


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def _soak(n_ops: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    subsets = [list(c) for k in range(1, N + 1) for c in itertools.combinations(range(N), k)]
    members = [list(rng.permutation(s)) for s in subsets]  # group rank order differs from global
    rounds = _plan(rng, n_ops, [len(m) for m in members])
    warm_up = max(1, len(rounds) // 5)
    tasks_before, fds_before = len(asyncio.all_tasks()), _open_fds()
    figures: dict = {}
    async with local_world(N, timeout=60) as world:
        groups = [[w.new_group([int(r) for r in m]) for m in members] for w in world]  # [rank][group]
        for number, batch in enumerate(rounds):
            if number == warm_up:
                gc.collect()
                figures["rss_warm"], figures["fds_warm"] = _rss_bytes(), _open_fds()
                figures["tasks_warm"] = len(asyncio.all_tasks())
            calls = [_run(step, groups[rank][step.group]) for step in batch for rank in range(N)
                     if groups[rank][step.group].rank >= 0]
            for check in await asyncio.gather(*calls):
                if check is not None:
                    check()
        gc.collect()
        figures["rss_end"], figures["fds_end"] = _rss_bytes(), _open_fds()
        figures["tasks_end"] = len(asyncio.all_tasks())
        for w in world:  # nothing left waiting or unclaimed in any rank's matching
            matcher = w.engine._mailbox._matcher
            assert not (matcher._posted or matcher._posted_any or matcher.unexpected), w
    figures["tasks_after"], figures["fds_after"] = len(asyncio.all_tasks()), _open_fds()
    figures["tasks_before"], figures["fds_before"] = tasks_before, fds_before
    figures["ops"] = sum(len(b) for b in rounds)
    return figures


def _check_flat(figures: dict) -> None:
    growth = (figures["rss_end"] - figures["rss_warm"]) / figures["rss_warm"]
    print(f"\n[soak] {figures['ops']} ops: RSS {figures['rss_warm'] / 2**20:.1f} -> {figures['rss_end'] / 2**20:.1f} "
          f"MiB ({growth:+.1%}), fds {figures['fds_before']}/{figures['fds_warm']}/{figures['fds_end']}/"
          f"{figures['fds_after']}, tasks {figures['tasks_before']}/{figures['tasks_warm']}/{figures['tasks_end']}/"
          f"{figures['tasks_after']}")
    assert growth < 0.10, figures
    assert figures["fds_end"] == figures["fds_warm"] and figures["fds_after"] == figures["fds_before"], figures
    assert figures["tasks_end"] == figures["tasks_warm"] and figures["tasks_after"] == figures["tasks_before"], figures


async def test_soak_short() -> None:
    _check_flat(await _soak(SHORT_OPS, seed=20240601))


@pytest.mark.soak
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("seed", [1, 2])
async def test_soak_long(seed: int) -> None:
    _check_flat(await _soak(LONG_OPS, seed=seed))

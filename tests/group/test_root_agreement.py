"""Ranks that disagree about a rooted call's root always find out.

Every rank names a root for a broadcast, reduce, gather or scatter (or an
object collective built on them); at least two names differ. Whatever the
timing, sizes and group size, every rank must raise CollectiveMismatchError,
in the rooted call or, at the latest, in its next operation of the group.
Never a silent divergence, never a wait until the timeout. See the
checks in asyncdist/group/calls.py.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any, Awaitable, Callable

import numpy as np
import pytest

import asyncdist as dist
from asyncdist.errors import AsyncDistError, CollectiveMismatchError
from asyncdist.group.calls import ANNOUNCE_AFTER
from asyncdist.group.process_group import ProcessGroup
from asyncdist.testing import local_world, spawn

SEEDS = 60
TIMEOUT = 10.0  # seconds: a hang would surface as OperationTimeoutError, which fails the test


def _rooted(op: str, g: ProcessGroup, root: int, count: int) -> Awaitable[Any]:
    mine = np.full(count, float(g.rank + 1))
    if op == "broadcast":
        return g.broadcast(mine, root)
    if op == "reduce":
        return g.reduce(mine, root)
    if op == "gather":
        return g.gather(mine, [np.empty(count) for _ in range(g.size)] if g.rank == root else None, root)
    if op == "scatter":
        return g.scatter(mine, [np.full(count, 7.0) for _ in range(g.size)] if g.rank == root else None, root)
    if op == "broadcast_object_list":
        return g.broadcast_object_list([{"from": g.rank, "pad": "x" * count}], root)
    if op == "gather_object":
        return g.gather_object(g.rank, [None] * g.size if g.rank == root else None, root)
    assert op == "scatter_object_list"
    return g.scatter_object_list([None], list(range(g.size)) if g.rank == root else None, root)


OPS = ["broadcast", "reduce", "gather", "scatter", "broadcast_object_list", "gather_object", "scatter_object_list"]


async def _rank(g: ProcessGroup, call: Callable[[], Awaitable[Any]], delay: float) -> list[str]:
    """What this rank saw: the rooted call, then (if that passed) an all_reduce."""
    seen = []
    for step in (call, lambda: g.all_reduce(np.ones(3))):
        await asyncio.sleep(delay)  # timing only: nothing waits on it
        try:
            await step()
        except AsyncDistError as error:
            seen.append(type(error).__name__)
            return seen
        seen.append("ok")
    return seen


@pytest.mark.parametrize("seed", range(SEEDS))
async def test_a_root_disagreement_raises_on_every_rank_in_the_call_or_the_next(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(2, 5)
    op = OPS[seed % len(OPS)]
    count = rng.choice([1, 5, 1000, 70_000])  # 70,000 float64: past the same-host memory threshold
    roots = [rng.randrange(n) for _ in range(n)]
    if len(set(roots)) == 1:
        roots[rng.randrange(n)] = (roots[0] + 1 + rng.randrange(n - 1)) % n
    delays = [rng.choice([0.0, 0.0, rng.random() * 0.02]) for _ in range(n)]
    async with local_world(n, timeout=TIMEOUT) as ranks:
        seen = await asyncio.gather(
            *(_rank(g, lambda g=g: _rooted(op, g, roots[g.rank], count), delays[g.rank]) for g in ranks)
        )
    case = f"{op} on {n} ranks, roots {roots}, {count} elements, delays {delays}"
    for rank, steps in enumerate(seen):
        assert steps in (["CollectiveMismatchError"], ["ok", "CollectiveMismatchError"]), (case, rank, steps)


async def test_two_ranks_that_each_broadcast_their_own_tensor_both_raise_and_the_group_goes_on() -> None:
    async with local_world(2, timeout=TIMEOUT) as ranks:
        tensors = [np.full(4, float(g.rank)) for g in ranks]
        outcomes = await asyncio.gather(
            *(_rank(g, lambda g=g: g.broadcast(tensors[g.rank], src=g.rank), 0.0) for g in ranks)
        )
        assert all(steps[-1] == "CollectiveMismatchError" for steps in outcomes), outcomes
        # Once every rank has seen the error, the group works again.
        x = [np.full(2, float(g.rank + 1)) for g in ranks]
        await asyncio.gather(*(g.all_reduce(v) for g, v in zip(ranks, x)))
        assert [v.tolist() for v in x] == [[3.0, 3.0]] * 2


async def test_ranks_that_agree_send_nothing_but_the_data() -> None:
    """Agreement costs no message: a rooted call announces itself only if it
    is still open after ANNOUNCE_AFTER, and none of these is."""
    calls = 50
    async with local_world(3, timeout=TIMEOUT) as ranks:
        sent_before = [list(g.engine.flight.counters.sent_messages) for g in ranks]
        for i in range(calls):
            tensors = [np.full(2, float(g.rank + i)) for g in ranks]
            await asyncio.gather(*(g.broadcast(t, src=0) for g, t in zip(ranks, tensors)))
            assert [t.tolist() for t in tensors] == [[float(i)] * 2] * 3
        sent = [sum(after) - sum(before) for after, before in
                zip((g.engine.flight.counters.sent_messages for g in ranks), sent_before)]
    # A binomial tree from rank 0 over 3 ranks: rank 0 sends to ranks 1 and 2, nobody else sends.
    assert sent == [2 * calls, 0, 0]


async def test_a_rank_left_waiting_announces_itself_and_the_root_it_names_finds_the_disagreement() -> None:
    """Rank 1 names rank 0 as the root, rank 0 names rank 1: each waits for the
    other's data. No message is sent until rank 1's announcement, ANNOUNCE_AFTER
    later, tells rank 0; then both raise long before the timeout."""
    loop = asyncio.get_running_loop()
    async with local_world(2, timeout=TIMEOUT) as ranks:
        started = loop.time()
        outcomes = await asyncio.gather(
            *(g.broadcast(np.zeros(2), src=1 - g.rank) for g in ranks), return_exceptions=True
        )
        assert all(isinstance(o, CollectiveMismatchError) for o in outcomes), outcomes
        assert ANNOUNCE_AFTER <= loop.time() - started < TIMEOUT / 2


def facade_own_root_broadcasts() -> list[str]:
    """A rank of the issue's program: broadcast from itself, then all_reduce."""
    dist.init_process_group("gloo")
    seen = []
    t = np.full(4, float(dist.get_rank()))
    for step in (lambda: dist.broadcast(t, src=dist.get_rank()), lambda: dist.all_reduce(np.ones(2))):
        try:
            step()
        except CollectiveMismatchError as error:
            seen.append(str(error))
            break
        seen.append("ok")
    dist.destroy_process_group()
    return seen


def test_the_facade_program_that_diverged_now_raises_on_both_ranks() -> None:
    for rank, seen in enumerate(spawn(2, facade_own_root_broadcasts, timeout=60)):
        assert seen[-1] != "ok" and ("disagree" in seen[-1] or "failed on another rank" in seen[-1]), (rank, seen)

"""Randomized fault injection inside ``grow()``: a member or a joiner dies, the survivors agree.

Each seed picks 3 or 4 members and 1 or 2 processes waiting to join, a
victim (a member or a joiner), a point of the grow that the victim reaches
(for a member: the start of its call, the members' agreement on the plan,
the leader's writing of the admissions, the wait for the connections, the
grown group's closing agreement; for a joiner: just registered, its verdict
read, the wait for the connections, the closing agreement) and how many
loop turns it goes on past it. Then the victim dies as under SIGKILL (its
sockets reset, its listener closed, its task stopped).

Every survivor runs what a user would: grow; on an error, shrink the group
it had (the documented recovery); then barrier, agree, shrink until the
group agrees that nothing failed. What must hold: every member's grow ends
alike (the same grown group, or the same error naming the same lost ranks),
and every surviving joiner took part in that outcome (in the same group, or
it raised); every survivor ends in the same group, of exactly the processes
still alive that the grow kept, and an all-reduce on it gives what NumPy
computes. A hang fails the seed (its deadline is far below the groups'
timeouts). On asyncio's loop the seed runs on virtual time (the heartbeat
timeout that finds a dead joiner costs nothing); on uvloop's, in real time.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import asyncdist
from asyncdist.engine.engine import Engine
from asyncdist.errors import AsyncDistError, PeerLostError
from asyncdist.group import growth
from asyncdist.group.fault import FaultTolerance
from asyncdist.group.process_group import ProcessGroup
from asyncdist.rendezvous import joins
from asyncdist.rendezvous.hash_store import HashStore
from asyncdist.rendezvous.store import PrefixStore
from asyncdist.transport.heartbeat import HeartbeatConfig

SEEDS = 100
MEMBER_POINTS = ("start", "decide0", "admit", "reach", "decide1")
JOINER_POINTS = ("registered", "verdict", "reach", "decide0")
HEARTBEAT = HeartbeatConfig(interval=0.1, timeout=0.5)  # how long a dead joiner that never dialed is waited for
TIMEOUT = 60.0  # the groups'; a seed that needs it has hung
SEED_DEADLINE = 15.0

WHO: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="")


@dataclass(frozen=True)
class Plan:
    members: int
    joiners: int
    victim: str  # "m<rank>" or "j<index>"
    point: str
    turns: int

    @classmethod
    def of(cls, seed: int) -> Plan:
        rng = random.Random(seed)
        members, joiners = 3 + seed % 2, 1 + seed // 2 % 2
        if seed % 3:
            point = MEMBER_POINTS[seed // 3 % len(MEMBER_POINTS)]
            victim = "m0" if point == "admit" else f"m{rng.randrange(members)}"
        else:
            point, victim = JOINER_POINTS[seed // 3 % len(JOINER_POINTS)], f"j{rng.randrange(joiners)}"
        return cls(members, joiners, victim, point, rng.randrange(40))


class Injector:
    """Notes each process's points (by its WHO) and engine; tells when the victim reaches its point."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.reached = asyncio.Event()
        self.killed = asyncio.Event()
        self.engines: dict[str, Engine] = {}
        self._decides: dict[str, int] = {}

    def at(self, point: str, engine: Engine | None = None) -> None:
        who = WHO.get()
        if engine is not None:
            self.engines[who] = engine
        if point == "decide":
            n = self._decides[who] = self._decides.get(who, -1) + 1
            point = f"decide{n}"
        if (who, point) == (self.plan.victim, self.plan.point):
            self.reached.set()


def hook(monkeypatch: pytest.MonkeyPatch, inject: Injector) -> None:
    """Wrap the grow's steps so that each reports its point."""
    decide, reach, admit = FaultTolerance.decide, Engine.reach, growth._admit
    register, wait_verdict = joins.register, joins.wait_verdict

    async def decide_(self: FaultTolerance, *args: Any, **kw: Any) -> Any:
        inject.at("decide", self._engine)
        return await decide(self, *args, **kw)

    async def reach_(self: Engine, *args: Any, **kw: Any) -> Any:
        inject.at("reach", self)
        return await reach(self, *args, **kw)

    async def admit_(*args: Any, **kw: Any) -> Any:
        inject.at("admit")
        return await admit(*args, **kw)

    async def register_(*args: Any, **kw: Any) -> Any:
        slot = await register(*args, **kw)
        inject.at("registered")
        return slot

    async def wait_verdict_(*args: Any, **kw: Any) -> Any:
        verdict = await wait_verdict(*args, **kw)
        inject.at("verdict")
        return verdict

    monkeypatch.setattr(FaultTolerance, "decide", decide_)
    monkeypatch.setattr(Engine, "reach", reach_)
    monkeypatch.setattr(growth, "_admit", admit_)
    monkeypatch.setattr(joins, "register", register_)
    monkeypatch.setattr(joins, "wait_verdict", wait_verdict_)


async def settle(g: ProcessGroup, inject: Injector) -> ProcessGroup:
    """After the kill (so that the last agreement counts the victim, if it is in ``g``):
    barrier, agree, shrink until the group agrees that nothing failed and nobody is lost."""
    await inject.killed.wait()
    while True:
        try:
            await g.barrier()
            ok = 1
        except AsyncDistError:
            ok = 0
            await g.revoke()
        if await g.agree(ok) and not g.failed_ranks():
            return g
        g = await g.shrink()


async def member(world: ProcessGroup, inject: Injector, joiners: int) -> tuple[Any, ProcessGroup]:
    """Grow; on an error, shrink and grow again (the documented recovery), admitting whoever still
    waits; settle. Returns (the first grow's outcome, the last group)."""
    WHO.set(f"m{world.rank}")
    inject.at("start", world.engine)
    group, first, want = world, None, joiners
    while True:
        try:
            grown = await group.grow(min_joiners=want)
        except AsyncDistError as exc:
            first = exc if first is None else first
            group, want = await settle(await group.shrink(), inject), 0
            continue
        return (grown.ranks if first is None else first), await settle(grown, inject)


async def joiner(store: HashStore, j: int, inject: Injector) -> tuple[Any, ProcessGroup | None]:
    WHO.set(f"j{j}")
    try:
        grown = await asyncdist.init_world(store=store, join=True, timeout=TIMEOUT, heartbeat=HEARTBEAT)
    except AsyncDistError as exc:
        return exc, None
    return grown.ranks, await settle(grown, inject)


def tail(error: BaseException) -> tuple[type, str]:
    """An error as every survivor must see it alike: its class and message after the ``rank N:`` prefix."""
    return type(error), str(error).split(": ", 1)[1]


async def check_all_reduce(groups: list[ProcessGroup]) -> None:
    inputs = [np.arange(6, dtype=np.float64) * (g.rank + 1) + g.ranks[g.rank] for g in groups]
    data = [x.copy() for x in inputs]
    await asyncio.gather(*(g.all_reduce(x) for g, x in zip(groups, data)))
    for x in data:
        np.testing.assert_allclose(x, np.sum(inputs, axis=0))


async def run(plan: Plan, monkeypatch: pytest.MonkeyPatch) -> None:
    inject = Injector(plan)
    hook(monkeypatch, inject)
    store = HashStore()
    worlds = list(await asyncio.gather(*(
        asyncdist.init_world(store=store, rank=r, world_size=plan.members, timeout=TIMEOUT, heartbeat=HEARTBEAT)
        for r in range(plan.members))))
    tasks = {f"m{r}": asyncio.ensure_future(member(w, inject, plan.joiners)) for r, w in enumerate(worlds)}
    tasks.update({f"j{j}": asyncio.ensure_future(joiner(store, j, inject)) for j in range(plan.joiners)})
    finals: list[ProcessGroup] = []
    try:
        await inject.reached.wait()
        for _ in range(plan.turns):
            await asyncio.sleep(0)
        engine = inject.engines.get(plan.victim)
        if engine is not None:
            engine.faults.crash()  # its sockets reset, as under SIGKILL
        tasks[plan.victim].cancel()
        inject.killed.set()
        await asyncio.gather(tasks[plan.victim], return_exceptions=True)
        if engine is not None:
            await engine.close()  # its listener too: a dial to it is refused
        alive = [who for who in tasks if who != plan.victim]
        results = dict(zip(alive, await asyncio.gather(*(tasks[who] for who in alive if who.startswith("m")))))
        for slot in range(1, plan.joiners + 1):  # a joiner claimed by a leader that died is told (as the end of
            # the job tells it: asyncdist-run closes the waiting room)
            await joins.answer_once(PrefixStore("asyncdist", store), slot, {"refused": "the members are done"})
        results.update(zip(alive[len(results):], await asyncio.gather(*(tasks[who] for who in alive
                                                                         if who.startswith("j")))))
        finals = [g for _, g in results.values() if g is not None]
        members = [results[who][0] for who in alive if who.startswith("m")]
        joined = [results[who][0] for who in alive if who.startswith("j")]
        if isinstance(members[0], tuple):  # grown: the same group everywhere, every surviving joiner in it
            assert all(m == members[0] for m in members), members
            assert len(members[0]) == plan.members + plan.joiners
            assert all(j == members[0] for j in joined), (members, joined)
        else:  # failed: the same error on every member, naming the same lost ranks; a joiner raised, or a later
            # grow took it in
            assert all(isinstance(m, PeerLostError) for m in members), members
            assert len({tail(m) for m in members}) == 1 and len({m.rank for m in members}) == 1, members
            assert all(isinstance(j, (AsyncDistError, tuple)) for j in joined), joined
        ranks = {g.ranks for g in finals}
        assert len(ranks) == 1, ranks
        (final,) = ranks
        assert len(final) == len(finals) and all(g.failed_ranks() == [] for g in finals)
        await check_all_reduce(sorted(finals, key=lambda g: g.rank))
    finally:
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        await asyncio.gather(*(g.close() for g in [*finals, *worlds]), return_exceptions=True)
        store.close()


@pytest.mark.parametrize("seed", range(SEEDS))
async def test_survivors_of_a_kill_inside_grow_agree(seed: int, virtual_clock: bool,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    plan = Plan.of(seed)
    try:
        await asyncio.wait_for(run(plan, monkeypatch), SEED_DEADLINE)
    except asyncio.TimeoutError:
        pytest.fail(f"{plan} did not finish within {SEED_DEADLINE} s")

"""Each kind of fault of a plan, applied to ranks in one loop (``local_world(n, faults=...)``).

Heartbeats are short here (50 ms pings, 250 ms timeout), so that a lost
link is found in a quarter of a second; every test also checks that the
operations the fault leaves alone give the right values.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest

from asyncdist import settings
from asyncdist.engine import operation
from asyncdist.errors import PeerLostError, RankExcludedError, RendezvousError
from asyncdist.testing import local_world
from asyncdist.testing.injector import LinkGate, RankKilled, installed
from asyncdist.transport import injection

HEARTBEAT_TIMEOUT = 0.25


@pytest.fixture
def short_heartbeat(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("ASYNCDIST_HEARTBEAT_INTERVAL", "0.05")
    monkeypatch.setenv("ASYNCDIST_HEARTBEAT_TIMEOUT", str(HEARTBEAT_TIMEOUT))
    settings.refresh()
    yield
    monkeypatch.undo()
    settings.refresh()


async def sums(g: Any, count: int, log: list[float]) -> list[float]:
    """``count`` all_reduces of ``rank + 1``; each sum is logged as it completes."""
    for _ in range(count):
        x = np.full(4, float(g.rank + 1))
        await g.all_reduce(x)
        log.append(float(x[0]))
    return log


async def run_all(ranks: list, body: Any, *args: Any) -> tuple[list, list[list[float]]]:
    logs: list[list[float]] = [[] for _ in ranks]
    outcomes = await asyncio.gather(*(body(g, *args, logs[g.rank]) for g in ranks), return_exceptions=True)
    return outcomes, logs


async def test_kill_at_the_kth_all_reduce(short_heartbeat: None) -> None:
    async with local_world(3, faults="kill 2 at all_reduce#3") as ranks:
        outcomes, logs = await run_all(ranks, sums, 5)
    assert outcomes[2] == RankKilled(2, "all_reduce#3")
    assert logs == [[6.0, 6.0]] * 3  # two completed everywhere, the third nowhere
    for rank in (0, 1):
        assert isinstance(outcomes[rank], PeerLostError) and outcomes[rank].rank == 2


async def test_kill_at_the_kth_send(short_heartbeat: None) -> None:
    got: list[float] = []

    async def sender(g: Any) -> None:
        for i in range(4):
            await g.send(np.array([float(i)]), 0)

    async def receiver(g: Any) -> None:
        for _ in range(4):
            x = np.zeros(1)
            await g.recv(x, 1)
            got.append(float(x[0]))

    async with local_world(2, faults="kill 1 at send#3") as ranks:
        outcomes = await asyncio.gather(receiver(ranks[0]), sender(ranks[1]), return_exceptions=True)
    assert got == [0.0, 1.0]
    assert outcomes[1] == RankKilled(1, "send#3")
    assert isinstance(outcomes[0], PeerLostError) and outcomes[0].rank == 1


async def test_a_pause_shorter_than_the_heartbeat_only_delays(short_heartbeat: None) -> None:
    async with local_world(3, faults="pause 1 at all_reduce#2 for 150ms") as ranks:
        start = time.monotonic()
        outcomes, logs = await run_all(ranks, sums, 3)
        elapsed = time.monotonic() - start
    assert logs == [[6.0] * 3] * 3 and outcomes == logs
    assert elapsed >= 0.15


async def test_a_long_pause_gets_the_rank_dropped_and_excluded(short_heartbeat: None) -> None:
    async with local_world(3, faults="pause 1 at all_reduce#2 for 600ms") as ranks:
        outcomes, logs = await run_all(ranks, sums, 3)
    assert logs == [[6.0]] * 3
    assert [type(o) for o in outcomes] == [PeerLostError, RankExcludedError, PeerLostError]
    assert outcomes[0].rank == outcomes[2].rank == 1
    assert "heartbeat timeout" in str(outcomes[0])
    assert "rank 1 was excluded from the job" in str(outcomes[1])


async def test_a_delayed_link_holds_every_message() -> None:
    async with local_world(2, faults="delay 0-1 40ms") as ranks:
        start = time.monotonic()
        outcomes, logs = await run_all(ranks, sums, 3)
        elapsed = time.monotonic() - start
    assert logs == [[3.0] * 3] * 2
    assert elapsed >= 3 * 0.04  # each all_reduce of two ranks waits for one message


def test_jitter_is_drawn_from_the_seed_per_link_direction() -> None:
    def delays(seed: int, src: int, dst: int) -> list[float]:
        gate = LinkGate(src, dst, seed)
        gate.delay, gate.jitter = 0.01, 0.05
        return [gate.next_delay() for _ in range(8)]

    first = delays(3, 0, 1)
    assert first == delays(3, 0, 1)
    assert first != delays(4, 0, 1) and first != delays(3, 1, 0)
    assert all(0.01 <= d <= 0.06 for d in first) and len(set(first)) == 8


async def test_a_jittered_link_keeps_the_order_of_its_messages() -> None:
    got: list[float] = []

    async def receive(g: Any) -> None:
        for _ in range(10):
            x = np.zeros(1)
            await g.recv(x, 1)
            got.append(float(x[0]))

    async with local_world(2, faults="seed 5; delay 0-1 0ms~30ms") as ranks:
        await asyncio.gather(receive(ranks[0]), *(ranks[1].send(np.array([float(i)]), 0) for i in range(10)))
    assert got == [float(i) for i in range(10)]  # though drawn delays differ, none overtakes another


async def test_a_slow_link_carries_its_rate() -> None:
    n = 50_000  # float64: 400 kB, each rank sends at least half of it over the one link
    async with local_world(2, faults="slow 0-1 2MB/s") as ranks:
        arrays = [np.full(n, float(g.rank + 1)) for g in ranks]
        start = time.monotonic()
        await asyncio.gather(*(g.all_reduce(a) for g, a in zip(ranks, arrays)))
        elapsed = time.monotonic() - start
    assert all((a == 3.0).all() for a in arrays)
    assert elapsed >= (n * 8 / 2) / 2e6


async def test_a_cut_link_loses_both_sides_after_the_heartbeat_timeout(short_heartbeat: None) -> None:
    async with local_world(2, faults="cut 0-1 at all_reduce#2 for 5s") as ranks:
        start = time.monotonic()
        outcomes, logs = await run_all(ranks, sums, 3)
        elapsed = time.monotonic() - start
    assert logs == [[3.0]] * 2
    assert [(type(o), o.rank) for o in outcomes] == [(PeerLostError, 1), (PeerLostError, 0)]
    assert all("heartbeat timeout" in str(o) for o in outcomes)
    assert HEARTBEAT_TIMEOUT <= elapsed < 2.0  # the heartbeat's verdict, long before the heal


async def test_a_cut_shorter_than_the_heartbeat_heals(short_heartbeat: None) -> None:
    async with local_world(2, faults="cut 0-1 at all_reduce#2 for 100ms") as ranks:
        start = time.monotonic()
        outcomes, logs = await run_all(ranks, sums, 3)
        elapsed = time.monotonic() - start
    assert logs == [[3.0] * 3] * 2 and outcomes == logs
    assert elapsed >= 0.1


async def test_a_partition_cuts_only_between_its_sides(short_heartbeat: None) -> None:
    async def pairs(g: Any, log: list[float]) -> list[float]:
        buddy, across = g.rank ^ 1, g.rank ^ 2  # 0-1 and 2-3 on one side each; 0-2 and 1-3 across
        for peer in (buddy, across):
            out, got = np.array([float(g.rank)]), np.zeros(1)
            await asyncio.gather(g.send(out, peer), g.recv(got, peer))
            log.append(float(got[0]))
        return log

    async with local_world(4, faults="partition 0,1|2,3 at send#1 for 5s") as ranks:
        outcomes, logs = await run_all(ranks, pairs)
    assert logs == [[1.0], [0.0], [3.0], [2.0]]  # each rank heard its own side's partner
    assert [(type(o), o.rank) for o in outcomes] == [(PeerLostError, r ^ 2) for r in range(4)]


async def test_a_refused_rank_cannot_join() -> None:
    with pytest.raises(RendezvousError, match=r"ranks \[2\] did not connect") as info:
        async with local_world(3, timeout=0.5, faults="refuse 2"):
            pass
    assert "fault plan: refuse 2" in info.value.__notes__


async def test_a_plan_is_gone_once_its_world_is_closed() -> None:
    async with local_world(2, faults="kill 1 at any#9"):
        assert installed() is not None and operation.ON_OPEN is not None and injection.INJECTOR is not None
    assert installed() is None and operation.ON_OPEN is None and injection.INJECTOR is None
    async with local_world(2) as ranks:  # and counts start again with the next plan
        assert installed() is None
        outcomes, logs = await run_all(ranks, sums, 2)
    assert logs == [[3.0, 3.0]] * 2

"""Ranks as Ray actors: placement, rendezvous through Ray, both faces, a killed actor.

Every result is checked against NumPy on the ranks' known inputs.
"""

from __future__ import annotations

import asyncio
import os
import time

import numpy as np
import pytest

from asyncdist.errors import InvalidArgumentError, PeerLostError, RendezvousError
from asyncdist.transport.heartbeat import HeartbeatConfig

ray = pytest.importorskip("ray")
from asyncdist.ray import ray_world  # noqa: E402

pytestmark = pytest.mark.usefixtures("ray_cluster")

N = 3
HEARTBEAT = HeartbeatConfig(interval=0.5, timeout=3.0)


def _inputs(rank: int) -> np.ndarray:
    return np.arange(5.0) * (rank + 1) + rank


async def _reduce_and_gather(pg) -> tuple[int, np.ndarray, list]:
    x = _inputs(pg.rank)
    await pg.all_reduce(x)
    gathered: list = [None] * pg.size
    await pg.all_gather_object(gathered, (pg.rank, os.getpid()))
    return pg.rank, x, gathered


def _facade_reduce() -> tuple[int, np.ndarray, str | None]:
    import asyncdist as dist
    x = _inputs(dist.get_rank())
    dist.all_reduce(x)
    return dist.get_rank(), x, os.environ.get("MASTER_ADDR")


def _placed(world, strategy: str) -> None:
    table = ray.util.placement_group_table(world.placement_group)
    assert table["strategy"] == strategy and len(table["bundles"]) == N


def test_await_and_facade_worlds_compute_the_reference() -> None:
    expected = sum(_inputs(r) for r in range(N))
    with ray_world(N, timeout=60) as world:
        _placed(world, "PACK")
        assert world.nodes == [ray.util.get_node_ip_address()] * N  # one node: the local cluster
        results = world.run(_reduce_and_gather)
        pids = [pid for _, pid in results[0][2]]
        assert len(set(pids)) == N and os.getpid() not in pids  # one actor process per rank
        for rank, (got_rank, x, gathered) in enumerate(results):
            assert got_rank == rank
            np.testing.assert_array_equal(x, expected)
            assert [r for r, _ in gathered] == list(range(N))
        # The blocking face, in the same actors: its own rendezvous, no MASTER_ADDR anywhere.
        for rank, (got_rank, x, master) in enumerate(world.run(_facade_reduce)):
            assert (got_rank, master) == (rank, None)
            np.testing.assert_array_equal(x, expected)
        # An asyncio driver awaits the ObjectRefs.
        async def drive():
            return await asyncio.gather(*world.submit(_reduce_and_gather))
        assert [r for r, _, _ in asyncio.run(drive())] == list(range(N))


async def _wait_for_rank_2(pg) -> None:
    if pg.rank == 2:
        await asyncio.Event().wait()  # until killed
    x = np.zeros(3)
    await pg.recv(x, src=2)  # rank 2 never sends: only its loss ends this


def test_a_killed_actor_is_a_lost_peer_on_the_others_within_the_heartbeat_timeout() -> None:
    with ray_world(N, strategy="SPREAD", heartbeat=HEARTBEAT, timeout=60) as world:
        _placed(world, "SPREAD")
        world.run(_reduce_and_gather)  # the await world is up on every rank
        refs = world.submit(_wait_for_rank_2)
        ready, _ = ray.wait(refs, timeout=0.5)
        assert ready == []  # everybody is waiting
        killed = time.monotonic()
        world.kill(2)
        outcomes = world.gather(refs)
        elapsed = time.monotonic() - killed
        for rank, outcome in enumerate(outcomes):
            assert isinstance(outcome, PeerLostError), (rank, outcome)
            assert outcome.rank == 2 and "rank 2" in str(outcome)
        assert elapsed < HEARTBEAT.timeout + 2.0
        with pytest.raises(PeerLostError, match="rank 2"):
            world.run(_reduce_and_gather)


def test_bad_requests_fail_with_clear_errors() -> None:
    with pytest.raises(InvalidArgumentError, match="n must be"):
        ray_world(0)
    with pytest.raises(InvalidArgumentError, match="strategy"):
        ray_world(2, strategy="EVERYWHERE")  # type: ignore[arg-type]
    with pytest.raises(RendezvousError, match="not placed within"):
        ray_world(2, cpus_per_rank=64, timeout=0.5)



async def _survive(pg, steps: int, stalls: int) -> tuple[int, tuple[int, ...], list[float]]:
    """docs/ray.md's loop: sum the ranks' ids + 1 each step; on a lost peer, shrink and redo the step."""
    from asyncdist.errors import AsyncDistError
    from asyncdist.ray import shrink
    if pg.ranks[pg.rank] == stalls:
        await asyncio.Event().wait()  # until killed: the others' first step waits for it
    sums = []
    while len(sums) < steps:
        x = np.full(2, pg.ranks[pg.rank] + 1.0)
        try:
            await pg.all_reduce(x)
            ok = 1
        except AsyncDistError:  # the lost peer, or another survivor's revoke
            await pg.revoke()
            ok = 0
        if await pg.agree(ok):  # the same answer on every survivor
            sums.append(float(x[0]))
        else:
            pg = await shrink(pg)  # this rank's group from now on, also for the driver
    return pg.rank, tuple(pg.ranks), sums


async def _grow(pg) -> tuple[int, tuple[int, ...]]:
    from asyncdist.ray import grow
    pg = await grow(pg, min_joiners=1)  # waits for the restarted actor
    return pg.rank, tuple(pg.ranks)


def test_survivors_shrink_and_a_restarted_actor_rejoins() -> None:
    with ray_world(N, heartbeat=HEARTBEAT, timeout=60, actor_options={"max_restarts": 1}) as world:
        first_pids = [pid for _, pid in world.run(_reduce_and_gather)[0][2]]
        with pytest.raises(InvalidArgumentError, match="rank 1 of a running world"):
            world.rejoin(world.actors[1])  # alive, never restarted
        restarted = world.actors[2]
        refs = world.submit(_survive, 5, stalls=2)
        world.kill(2, restart=True)
        # At once, while Ray restarts it (Ray fails calls to a restarting actor): rejoin waits for
        # the new instance; it registers through rank 0's store and waits for a grow ...
        joined = world.rejoin(restarted)
        outcomes = world.gather(refs)
        assert isinstance(outcomes[2], PeerLostError) and outcomes[2].rank == 2
        assert outcomes[:2] == [(0, (0, 1), [3.0] * 5), (1, (0, 1), [3.0] * 5)]  # 1 + 2, five times
        assert world.ranks == (0, 1) and world.size == 2  # the driver follows the shrink
        assert world.run(_grow) == [(0, (0, 1, 3)), (1, (0, 1, 3))]  # ... which the survivors make
        assert ray.get(joined) == 2
        assert world.ranks == (0, 1, 3) and world.actors[2] is restarted  # a new job id, the next rank
        expected = sum(_inputs(r) for r in range(N))
        results = world.run(_reduce_and_gather)
        for rank, (got_rank, x, gathered) in enumerate(results):
            assert got_rank == rank
            np.testing.assert_array_equal(x, expected)
        pids = [pid for _, pid in results[0][2]]
        assert pids[:2] == first_pids[:2] and pids[2] != first_pids[2]  # rank 2 is a new process
        world.kill(0)  # the store goes with rank 0's actor: nobody can rejoin any more
        with pytest.raises(PeerLostError, match="serves the world's store"):
            world.rejoin(restarted)

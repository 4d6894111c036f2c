"""Rejoining: processes that ``init_world(..., join=True)`` and members that ``grow()``.

Real ranks over real sockets in one loop (a HashStore as the job's store):
the grown group is the same on every process, newcomers take the next ranks,
and its collectives give the values NumPy computes from the inputs. A grow
with nobody waiting returns the group itself; a joiner with another secret
is refused and raises, saying why; two joiners at once both get in; an
admitted process that never connects fails the grow in time, not in a hang;
grow and shrink compose both ways; a joiner's errors name it as a joining
process, not by the rank it borrows to reach the store.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import time

import numpy as np
import pytest

import asyncdist
from asyncdist.errors import InvalidArgumentError, PeerLostError, RendezvousError
from asyncdist.group.process_group import ProcessGroup
from asyncdist.rendezvous import joins
from asyncdist.rendezvous.hash_store import HashStore
from asyncdist.rendezvous.store import PrefixStore
from asyncdist.testing import crash
from asyncdist.transport.heartbeat import HeartbeatConfig

WAIT = 20.0  # seconds; only a broken grow ever waits this long


async def _world(store: HashStore, n: int, heartbeat: HeartbeatConfig | None = None) -> list[ProcessGroup]:
    return list(await asyncio.gather(*(asyncdist.init_world(store=store, rank=r, world_size=n, timeout=WAIT,
                                                            heartbeat=heartbeat) for r in range(n))))


async def _check_all_reduce(groups: list[ProcessGroup]) -> None:
    """An all-reduce and an all-gather over ``groups`` (by group rank) against NumPy."""
    inputs = [np.arange(5, dtype=np.float64) * (g.rank + 1) + g.ranks[g.rank] for g in groups]
    data = [x.copy() for x in inputs]
    await asyncio.gather(*(g.all_reduce(x) for g, x in zip(groups, data)))
    for x in data:
        np.testing.assert_allclose(x, np.sum(inputs, axis=0))
    gathered = [np.empty(len(groups), np.int64) for _ in groups]
    await asyncio.gather(*(g.all_gather_into_tensor(out, np.array([g.rank * 10], np.int64))
                           for g, out in zip(groups, gathered)))
    for out in gathered:
        assert out.tolist() == [10 * r for r in range(len(groups))]


async def test_a_joiner_gets_the_next_rank_and_everyone_the_same_bigger_group() -> None:
    store = HashStore()
    worlds = await _world(store, 3)
    joiner = asyncio.ensure_future(asyncdist.init_world(store=store, join=True, timeout=WAIT))
    groups: list[ProcessGroup] = []
    try:
        grown = list(await asyncio.gather(*(w.grow(min_joiners=1) for w in worlds)))
        groups = [*grown, await joiner]
        for r, g in enumerate(groups):
            assert (g.rank, g.size, g.ranks, g.name) == (r, 4, (0, 1, 2, 3), "world")
            assert g is not worlds[min(r, 2)]
        await _check_all_reduce(groups)
        await _check_all_reduce(worlds)  # the old group still works
    finally:
        await asyncio.gather(*(g.close() for g in [*worlds, *groups]), return_exceptions=True)
        store.close()


async def test_grow_with_nobody_waiting_returns_the_same_group_at_once() -> None:
    store = HashStore()
    worlds = await _world(store, 3)
    try:
        start = time.monotonic()
        grown = await asyncio.gather(*(w.grow() for w in worlds))
        assert time.monotonic() - start < 2.0
        assert all(g is w for g, w in zip(grown, worlds))
        await _check_all_reduce(worlds)
    finally:
        await asyncio.gather(*(w.close() for w in worlds))
        store.close()


async def test_a_joiner_with_another_secret_is_refused_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    store = HashStore()
    worlds = await _world(store, 2)
    try:
        monkeypatch.setenv("ASYNCDIST_SECRET", "not-the-jobs-secret")  # read by the joiner only: the ranks have theirs
        joiner = asyncio.ensure_future(asyncdist.init_world(store=store, join=True, timeout=WAIT))
        grown = await asyncio.gather(*(w.grow(min_joiners=1) for w in worlds))
        assert all(g is w for g, w in zip(grown, worlds))
        with pytest.raises(RendezvousError, match=r"refused to admit it: rank 0 of group 'world' refused a joining "
                                                  r"process \(pid \d+ on .*not made with this job's secret"):
            await joiner
        await _check_all_reduce(worlds)
    finally:
        await asyncio.gather(*(w.close() for w in worlds))
        store.close()


async def test_two_joiners_at_once_then_a_third_get_ids_never_used() -> None:
    store = HashStore()
    worlds = await _world(store, 3)
    groups: list[ProcessGroup] = list(worlds)
    try:
        joiners = [asyncio.ensure_future(asyncdist.init_world(store=store, join=True, timeout=WAIT)) for _ in range(2)]
        grown = await asyncio.gather(*(w.grow(min_joiners=2) for w in worlds))
        groups = [*grown, *await asyncio.gather(*joiners)]
        assert sorted(g.rank for g in groups) == [0, 1, 2, 3, 4]
        assert {g.ranks for g in groups} == {(0, 1, 2, 3, 4)}
        groups.sort(key=lambda g: g.rank)
        await _check_all_reduce(groups)

        third = asyncio.ensure_future(asyncdist.init_world(store=store, join=True, timeout=WAIT))
        again = await asyncio.gather(*(g.grow(min_joiners=1) for g in groups))
        groups = [*again, await third]
        assert [(g.rank, g.ranks) for g in groups] == [(r, (0, 1, 2, 3, 4, 5)) for r in range(6)]
        await _check_all_reduce(groups)
    finally:
        await asyncio.gather(*(g.close() for g in groups), return_exceptions=True)
        store.close()


async def test_an_admitted_process_that_never_connects_fails_the_grow_in_time(virtual_clock: bool) -> None:
    """A registration whose process died (its port is closed) is admitted; the grow fails on every member
    after the heartbeat timeout (virtual time where the loop allows), naming its id; shrink, then go on."""
    store = HashStore()
    worlds = await _world(store, 2, HeartbeatConfig(interval=0.5, timeout=2.0))
    try:
        secret, job_id = store.get("asyncdist/secret"), store.get("asyncdist/job_id").decode()
        await joins.register(PrefixStore("asyncdist", store),
                             joins.Registration.make(secret, job_id, "127.0.0.1", 9, "pid 1 on nowhere"))
        loop = asyncio.get_running_loop()
        start = loop.time()
        results = await asyncio.gather(*(w.grow(min_joiners=1, timeout=1.0) for w in worlds), return_exceptions=True)
        assert loop.time() - start < worlds[0].engine.heartbeat_timeout + 5.0
        for r, result in enumerate(results):
            assert isinstance(result, PeerLostError) and result.rank == 2, result
            assert str(result).startswith(f"rank {r}: grow() of group 'world' failed: global rank(s) [2] were lost")
        survivors = list(await asyncio.gather(*(w.shrink() for w in worlds)))  # the documented recovery
        assert [g.ranks for g in survivors] == [(0, 1), (0, 1)]
        await _check_all_reduce(survivors)
        worlds = survivors
    finally:
        await asyncio.gather(*(w.close() for w in worlds))
        store.close()


async def test_a_joiner_given_a_rank_is_refused_before_anything_is_sent() -> None:
    store = HashStore()
    with pytest.raises(InvalidArgumentError, match=r"give no rank or world_size \(got rank=1, world_size=-1\)"):
        await asyncdist.init_world(store=store, join=True, rank=1)
    assert store.num_keys() == 0
    store.close()


async def test_shrink_after_a_crash_then_grow_then_shrink_again() -> None:
    """Grow composes with shrink both ways: the shrunk group grows, the grown one shrinks."""
    store = HashStore()
    worlds = await _world(store, 3)
    everyone: list[ProcessGroup] = list(worlds)
    try:
        crash(worlds[1])
        survivors = list(await asyncio.gather(worlds[0].shrink(), worlds[2].shrink()))
        assert [g.ranks for g in survivors] == [(0, 2), (0, 2)]
        joiner = asyncio.ensure_future(asyncdist.init_world(store=store, join=True, timeout=WAIT))
        grown = [*await asyncio.gather(*(g.grow(min_joiners=1) for g in survivors)), await joiner]
        everyone += grown
        assert [(g.rank, g.ranks) for g in grown] == [(r, (0, 2, 3)) for r in range(3)]
        await _check_all_reduce(grown)

        crash(grown[1])  # global rank 2, a survivor of the first loss
        again = list(await asyncio.gather(grown[0].shrink(), grown[2].shrink()))
        assert [(g.rank, g.ranks) for g in again] == [(0, (0, 3)), (1, (0, 3))]
        everyone += again
        await _check_all_reduce(again)
    finally:
        await asyncio.gather(*(g.close() for g in everyone), return_exceptions=True)
        store.close()


async def test_too_few_joiners_fail_the_grow_on_every_member_in_time() -> None:
    store = HashStore()
    worlds = await _world(store, 3)
    try:
        start = time.monotonic()
        results = await asyncio.gather(*(w.grow(min_joiners=1, timeout=0.5) for w in worlds), return_exceptions=True)
        assert time.monotonic() - start < 5.0
        for result in results:
            assert isinstance(result, RendezvousError)
            assert str(result) == "rank 0 (the grow's leader): grow: waited for 1 process(es) to join, 0 came in time"
        await _check_all_reduce(worlds)
    finally:
        await asyncio.gather(*(w.close() for w in worlds))
        store.close()


async def test_a_joiner_that_cannot_reach_the_store_is_named_as_joining_not_as_a_rank(monkeypatch) -> None:
    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("ASYNCDIST_SECRET", "s3cret")
    with pytest.raises(RendezvousError) as refused:
        await asyncdist.init_world(f"tcp://127.0.0.1:{port}", join=True, timeout=0.3)
    assert re.match(rf"joining process \(pid {os.getpid()} on .*\): cannot use the store at 127\.0\.0\.1:{port}",
                    str(refused.value)), refused.value
    assert "rank 1" not in str(refused.value)


async def test_a_grow_after_the_store_serving_rank_died_fails_at_once_saying_the_store_is_gone(monkeypatch) -> None:
    """Under tcp:// rank 0 serves the store: once it is dead, a grow of the survivors fails on every member
    within seconds (not the group's timeout), saying that the store is gone."""
    with socket.socket() as probe:  # a free port for rank 0's store (bound by it at once below)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("ASYNCDIST_SECRET", "s3cret")
    worlds = list(await asyncio.gather(*(asyncdist.init_world(f"tcp://127.0.0.1:{port}", rank=r, world_size=3,
                                                              timeout=WAIT) for r in range(3))))
    everyone: list[ProcessGroup] = list(worlds)
    try:
        crash(worlds[0])
        await worlds[0].close()  # its store server stops with it, as with the process
        survivors = list(await asyncio.gather(worlds[1].shrink(), worlds[2].shrink()))
        everyone += survivors
        start = time.monotonic()
        results = await asyncio.gather(*(g.grow() for g in survivors), return_exceptions=True)
        assert time.monotonic() - start < 5.0
        for result in results:
            assert isinstance(result, RendezvousError), result
            assert re.fullmatch(rf"rank 1 \(the grow's leader\): TCPStore: the store at 127\.0\.0\.1:{port} is gone: "
                                r".*its server has stopped \(under tcp:// and env:// by hand, rank 0 serves it: "
                                r"is rank 0 dead\?\)", str(result)), result
        await _check_all_reduce(survivors)  # the survivors go on without a store
    finally:
        await asyncio.gather(*(g.close() for g in everyone), return_exceptions=True)

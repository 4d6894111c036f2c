"""A group's lifecycle through the await API: open, use, close.

``asyncdist.init_world`` (and ``asyncdist.testing.local_world`` over it) opens a
world of ranks in one loop; ``ProcessGroup.on_close`` closers run in reverse
order of registration when it closes, awaitables awaited; a closed world
refuses every operation with ``ClosedError``, and its peers see it leave with
``PeerLostError``; subgroups are made, used and closed on a live world.
Results are checked against values computed here; ranks wait on each other's
messages and events, never on sleeps.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import numpy as np
import pytest

import asyncdist
from asyncdist.errors import (
    ClosedError,
    InvalidArgumentError,
    InvalidRankError,
    PeerLostError,
)
from asyncdist.group.process_group import ProcessGroup
from asyncdist.rendezvous.hash_store import HashStore
from asyncdist.testing import local_world

WAIT = 10.0  # seconds; only a broken group ever waits this long


async def test_init_world_opens_a_world_that_works_and_close_refuses_what_comes_after() -> None:
    store = HashStore()
    try:
        worlds = await asyncio.gather(
            *(asyncdist.init_world(store=store, rank=r, world_size=3, timeout=WAIT) for r in range(3))
        )
        for r, world in enumerate(worlds):
            assert isinstance(world, ProcessGroup)
            assert (world.name, world.rank, world.size, world.ranks, world.timeout) == ("world", r, 3, (0, 1, 2), WAIT)

        data = [np.arange(4, dtype=np.int64) * (r + 1) for r in range(3)]
        await asyncio.gather(*(w.all_reduce(x) for w, x in zip(worlds, data)))
        for x in data:
            assert x.tolist() == [0, 6, 12, 18]
        got = np.zeros(2, np.float32)
        await asyncio.gather(worlds[2].send(np.array([1.5, -2.0], np.float32), dst=0, tag=3), worlds[0].recv(got, 2, 3))
        assert got.tolist() == [1.5, -2.0]

        await asyncio.gather(*(w.close() for w in worlds))
        for r, world in enumerate(worlds):
            for name, call in _every_kind_of_call(world, peer=(r + 1) % 3):
                with pytest.raises(ClosedError) as caught:
                    result = call()
                    if asyncio.iscoroutine(result):
                        await result
                assert str(caught.value) == f"rank {r}: the process group is closed", name
            await world.close()  # closing again does nothing
        # the caller's store is the caller's: init_world does not close it
        store.set("still", "open")
        assert store.get("still") == b"open"
    finally:
        store.close()


def _every_kind_of_call(world: ProcessGroup, peer: int) -> list:
    """(name, call) for each kind of operation; a call returns a coroutine or a Work."""
    return [
        ("send", lambda: world.send(np.zeros(1), peer)),
        ("isend", lambda: world.isend(np.zeros(1), peer)),
        ("recv", lambda: world.recv(np.zeros(1), peer)),
        ("irecv", lambda: world.irecv(np.zeros(1))),
        ("all_reduce", lambda: world.all_reduce(np.zeros(1))),
        ("broadcast", lambda: world.broadcast(np.zeros(1), 0)),
        ("barrier", lambda: world.barrier()),
    ]


async def test_closers_run_in_reverse_order_awaitables_awaited_before_the_engine_closes() -> None:
    async with local_world(2) as ranks:
        world, peer = ranks
        ran: list[str] = []
        loop = asyncio.get_running_loop()

        def plain() -> None:
            ran.append("plain")

        async def coroutine() -> None:
            await asyncio.sleep(0)  # a turn of the loop: close must await the whole coroutine
            ran.append("coroutine")

        def future() -> asyncio.Future:
            done = loop.create_future()
            loop.call_soon(lambda: (ran.append("future"), done.set_result(None)))
            return done

        async def say_goodbye() -> None:
            # registered last, so it runs first: the engine (closed by the
            # closer init_world registered) still works here
            await world.send(np.array([42], np.int64), dst=1, tag=9)
            ran.append("goodbye")

        for closer in (plain, coroutine, future, say_goodbye):
            world.on_close(closer)
        farewell = np.zeros(1, np.int64)
        receiving = peer.irecv(farewell, src=0, tag=9)

        await world.close()
        assert ran == ["goodbye", "future", "coroutine", "plain"]
        assert await asyncio.wait_for(receiving, WAIT) == 0
        assert farewell.tolist() == [42]
        # closers run once
        await world.close()
        assert ran == ["goodbye", "future", "coroutine", "plain"]
        with pytest.raises(ClosedError):
            await world.barrier()


async def test_a_closer_that_raises_does_not_stop_the_others_and_its_error_comes_out_last() -> None:
    async with local_world(2) as ranks:
        world, ran = ranks[0], []

        def fails(name: str) -> None:
            ran.append(name)
            raise RuntimeError(name)

        world.on_close(lambda: ran.append("first registered"))
        world.on_close(lambda: fails("second"))
        world.on_close(lambda: fails("third"))
        with pytest.raises(RuntimeError, match="^third$"):
            await world.close()
        # every closer ran, newest first, the engine's among them (registered first of all)
        assert ran == ["third", "second", "first registered"]
        with pytest.raises(ClosedError):
            await world.all_reduce(np.zeros(1))


async def test_closing_fails_this_ranks_pending_receives_with_closed_error() -> None:
    async with local_world(2) as ranks:
        mine = ranks[0].irecv(np.zeros(1), src=1, tag=1)
        await ranks[0].close()
        with pytest.raises(ClosedError) as caught:
            await asyncio.wait_for(mine, WAIT)
        assert str(caught.value) == "rank 0: the process group was destroyed"


async def test_the_peers_of_a_rank_that_closes_see_it_leave_and_go_on_without_it() -> None:
    async with local_world(3) as ranks:
        theirs = [ranks[r].irecv(np.zeros(1), src=0, tag=1) for r in (1, 2)]
        any_source = ranks[1].irecv(np.zeros(1), tag=2)  # waits on ranks 0 and 2

        await ranks[0].close()
        for work in theirs:
            with pytest.raises(PeerLostError) as lost:
                await asyncio.wait_for(work, WAIT)
            assert str(lost.value) == "rank 0 closed its process group" and lost.value.rank == 0
        with pytest.raises(PeerLostError) as lost:
            await ranks[1].send(np.zeros(1), dst=0)
        assert str(lost.value) == "rank 0 closed its process group"

        # what does not need rank 0 goes on: rank 2 can still satisfy the any-source receive
        await ranks[2].send(np.array([7.0]), dst=1, tag=2)
        assert await asyncio.wait_for(any_source, WAIT) == 2
        pair = [ranks[r].new_group([1, 2], name="survivors") for r in (1, 2)]
        data = [np.array([10.0]), np.array([5.0])]
        await asyncio.gather(*(g.all_reduce(x) for g, x in zip(pair, data)))
        assert [x.tolist() for x in data] == [[15.0], [15.0]]


async def test_local_world_closes_every_rank_when_the_body_raises() -> None:
    kept: list[ProcessGroup] = []
    with pytest.raises(RuntimeError, match="^the body failed$"):
        async with local_world(2) as ranks:
            kept.extend(ranks)
            raise RuntimeError("the body failed")
    assert len(kept) == 2
    for r, world in enumerate(kept):
        with pytest.raises(ClosedError) as caught:
            await world.barrier()
        assert str(caught.value) == f"rank {r}: the process group is closed"


async def test_subgroups_are_made_used_and_closed_on_a_live_world() -> None:
    async with local_world(3) as ranks:
        pairs = [w.new_group([2, 0]) for w in ranks]
        evens = [w.new_group([0, 2], name="evens", timeout=timedelta(seconds=2)) for w in ranks]
        for w, pair, even in zip(ranks, pairs, evens):
            assert (pair.name, pair.ranks, pair.size, pair.timeout) == ("local3/1", (2, 0), 2, w.timeout)
            assert (even.name, even.ranks, even.timeout) == ("evens", (0, 2), 2.0)
            assert w.subgroups.groups == [pair, even]
        # group ranks follow the order given; rank 1 is in neither
        assert [p.rank for p in pairs] == [1, -1, 0]
        assert [e.rank for e in evens] == [0, -1, 1]
        assert (pairs[0].global_rank(0), pairs[0].group_rank(0)) == (2, 1)

        data = {0: np.array([1, 2], np.int64), 2: np.array([30, 40], np.int64)}
        await asyncio.gather(*(pairs[r].all_reduce(data[r]) for r in (0, 2)))
        assert data[0].tolist() == data[2].tolist() == [31, 42]
        got = np.zeros(1, np.int64)
        await asyncio.gather(evens[2].send(np.array([5], np.int64), dst=0), evens[0].recv(got, src=1))
        assert got.tolist() == [5]
        with pytest.raises(InvalidRankError) as caught:
            await pairs[1].all_reduce(np.zeros(1))
        assert str(caught.value) == "rank 1 is not a member of group 'local3/1' (ranks [2, 0])"

        # closing a subgroup forgets it; the world and the other subgroup go on
        await asyncio.gather(*(p.close() for p in pairs))
        await asyncio.gather(*(p.close() for p in pairs))  # twice is fine
        assert [w.subgroups.groups for w in ranks] == [[e] for e in evens]
        xs = [np.array([float(r)]) for r in range(3)]
        await asyncio.gather(*(w.all_reduce(x) for w, x in zip(ranks, xs)))
        assert [x.tolist() for x in xs] == [[3.0]] * 3
        ys = {0: np.array([2.0]), 2: np.array([3.0])}
        await asyncio.gather(*(evens[r].all_reduce(ys[r], op=asyncdist.ReduceOp.PRODUCT) for r in (0, 2)))
        assert ys[0].tolist() == ys[2].tolist() == [6.0]
        # names keep counting: the next unnamed subgroup is the third made
        assert [w.new_group([0, 1]).name for w in ranks] == ["local3/3"] * 3

        with pytest.raises(InvalidRankError) as caught:
            ranks[0].new_group([0, 3])
        assert str(caught.value) == "invalid rank 3 for group 'local3' of size 3"
        with pytest.raises(InvalidArgumentError) as caught:
            ranks[0].new_group([0], timeout=0)
        assert str(caught.value) == "new_group: timeout must be positive, got 0"


async def test_a_subgroup_of_a_closed_world_is_closed_too() -> None:
    async with local_world(2) as ranks:
        pairs = [w.new_group([1, 0], name="pair") for w in ranks]
        await asyncio.gather(*(w.close() for w in ranks))
        for r, pair in enumerate(pairs):
            with pytest.raises(ClosedError) as caught:
                await pair.all_reduce(np.zeros(1))
            assert str(caught.value) == f"rank {r}: the process group is closed"

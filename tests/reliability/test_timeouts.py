"""Timeouts: every operation honours its group's timeout and ``Work.wait(timeout)``.

An expired operation raises OperationTimeoutError (a TimeoutError) whose
message names the operation, the group, the collective call number (the tag,
for point to point) and the peers it was still waiting for; the other
members learn of a group timeout through the ABORT and fail at once, and the
group is usable again once every member has made the call. A
``Work.wait(timeout)`` that gives up says the same, and the operation goes on.

The tests that check exactly which peers are awaited hold the absent ranks
back with messages, never with sleeps: a rank that takes part sends a token
after its part, on the same stream, so once the token is in, so is its part.
"""

from __future__ import annotations

import asyncio
import re
import time
from datetime import timedelta

import numpy as np
import pytest

import asyncdist as dist
from asyncdist.errors import OperationTimeoutError
from asyncdist.testing import local_world, spawn
from asyncdist.group.work import Work

TIMEOUT = 0.3
ABSENT = 2  # the rank that does not come

# Each call as group rank g.rank makes it; rooted calls wait on the absent rank.
CALLS = {
    "barrier": lambda g: g.barrier(),
    "broadcast": lambda g: g.broadcast(np.ones(4), ABSENT),
    "all_reduce": lambda g: g.all_reduce(np.ones(4)),
    "all_reduce_ring": lambda g: g.all_reduce(np.ones(1 << 14)),  # 128 KiB: the ring
    "reduce": lambda g: g.reduce(np.ones(4), 0),
    "all_gather_into_tensor": lambda g: g.all_gather_into_tensor(np.empty(4 * g.size), np.ones(4)),
    "reduce_scatter_tensor": lambda g: g.reduce_scatter_tensor(np.empty(4), np.ones(4 * g.size)),
    "gather": lambda g: g.gather(np.ones(2), [np.empty(2) for _ in range(g.size)] if g.rank == 0 else None, 0),
    "scatter": lambda g: g.scatter(np.empty(2), [np.ones(2)] * g.size if g.rank == ABSENT else None, ABSENT),
    "all_to_all_single": lambda g: g.all_to_all_single(np.empty(g.size), np.ones(g.size)),
    "all_gather_object": lambda g: g.all_gather_object([None] * g.size, {"rank": g.rank}),
}


def _check_message(error: BaseException, name: str, call: int, group: str) -> None:
    assert isinstance(error, OperationTimeoutError) and isinstance(error, TimeoutError), repr(error)
    message = str(error)
    collective = name.removesuffix("_ring").replace("all_gather_object", "all_gather")
    assert collective in message, message
    assert f"call #{call} in group {group!r}" in message, message
    assert re.search(r"still (waiting for|sending to) ranks? [\[\d]|relayed by rank \d", message), message


@pytest.mark.parametrize("name", sorted(CALLS))
async def test_a_collective_that_a_rank_misses_times_out_naming_it(name: str) -> None:
    call = CALLS[name]
    async with local_world(3) as ranks:
        for g in ranks:
            g.timeout = TIMEOUT
        start = time.monotonic()
        present = await asyncio.gather(*(call(g) for g in ranks if g.rank != ABSENT), return_exceptions=True)
        took = time.monotonic() - start
        errors = [r for r in present if isinstance(r, BaseException)]
        assert errors, f"{name}: nobody waited on the absent rank"
        assert took < TIMEOUT + 2, took
        for error in errors:
            _check_message(error, name, 1, "local3")  # the user's first call is #1 (init_world's barrier is #0)
        # Each names the peer it waited for itself: the absent rank, or a rank
        # that waits on it (whichever deadline fires first, the others hear
        # of it in its ABORT).
        # The absent rank makes the call late, and does not hang: the ABORT
        # failed the call already, unless its part only sends (a root's).
        (late,) = await asyncio.gather(asyncio.wait_for(call(ranks[ABSENT]), 5), return_exceptions=True)
        assert late is None or (isinstance(late, OperationTimeoutError) and "relayed by rank" in str(late)), late
        # Everyone is at the same call number again: the group works.
        x = [np.full(2, float(g.rank)) for g in ranks]
        await asyncio.gather(*(g.all_reduce(v) for g, v in zip(ranks, x)))
        assert all(v.tolist() == [3.0, 3.0] for v in x)


async def test_a_subgroup_has_its_own_timeout_and_name() -> None:
    async with local_world(3) as ranks:
        pair = [g.new_group([0, 1], timeout=TIMEOUT, name="pair") for g in ranks]
        with pytest.raises(OperationTimeoutError) as info:
            await pair[0].all_reduce(np.ones(3))
        _check_message(info.value, "all_reduce", 1, "pair")
        assert "all_reduce(sum, float64[3])" in str(info.value) and "still waiting for rank 1" in str(info.value)
        # Rank 1 comes late. Rank 0's message is there and its part needs no
        # more, so it may finish; or the ABORT, read first, fails it. No hang.
        (late,) = await asyncio.gather(asyncio.wait_for(pair[1].all_reduce(np.ones(3)), 5), return_exceptions=True)
        assert late is None or "relayed by rank 0" in str(late), late
        x, y = np.ones(1), np.ones(1)
        await asyncio.gather(pair[0].all_reduce(x), pair[1].all_reduce(y))
        assert x[0] == y[0] == 2.0


async def test_point_to_point_operations_time_out_naming_peer_tag_and_group() -> None:
    async with local_world(2) as (a, b):
        b.timeout = a.timeout = TIMEOUT
        start = time.monotonic()
        with pytest.raises(OperationTimeoutError,
                           match=rf"rank 1: recv from rank 0 \(tag 5, group 'local2'\) Timed out after {TIMEOUT:g} s"):
            await b.recv(np.zeros(1), 0, tag=5)
        assert TIMEOUT <= time.monotonic() - start < TIMEOUT + 2
        with pytest.raises(OperationTimeoutError, match=r"recv from any rank \(tag 6"):
            await b.irecv(np.zeros(1), None, tag=6)  # a Work: the group's timeout too
        # A send that the receiver does not read: the receiver's loop stops reading.
        loop = asyncio.get_running_loop()
        receiver = b.engine._connections[0]
        loop.remove_reader(receiver._fd)
        try:
            with pytest.raises(OperationTimeoutError, match=r"rank 0: send to rank 1 \(tag 7, group 'local2'\)"):
                await a.send(np.ones(4 << 20), 1, tag=7)
        finally:
            loop.add_reader(receiver._fd, receiver._read)
        b.timeout = 30
        got = np.zeros(4 << 20)
        await b.recv(got, 0, tag=7)  # the send was not withdrawn: it completes
        assert got[0] == 1.0


async def test_work_wait_timeout_bounds_only_the_wait() -> None:
    async with local_world(2) as (a, b):
        out = np.zeros(2)
        work = b.irecv(out, 0, tag=3)
        start = time.monotonic()
        with pytest.raises(OperationTimeoutError) as info:
            await asyncio.to_thread(work.wait, 0.2)
        assert str(info.value) == ("rank 1: recv from rank 0 (tag 3, group 'local2') Timed out after 0.2 s "
                                   "(Work.wait timeout); still waiting for rank 0")
        assert 0.2 <= time.monotonic() - start < 2
        await a.send(np.arange(2.0), 1, tag=3)
        assert await asyncio.to_thread(work.wait, timedelta(seconds=5)) is True
        assert out.tolist() == [0.0, 1.0]


async def test_work_wait_names_the_call_the_group_and_exactly_the_ranks_still_awaited() -> None:
    async with local_world(4) as ranks:
        zero, one, two, three = ranks
        # gather to rank 0 (a direct exchange: the root waits on every rank at
        # once), rank 2 holding back. Ranks 1 and 3 take part; the token each
        # sends after its part follows it on the same stream.
        slots = [np.zeros(2) for _ in ranks]
        gathered = Work.start(lambda: zero.gather(np.zeros(2), slots, 0), "gather", slots, rank=0)
        for g in (one, three):
            await g.gather(np.full(2, float(g.rank)), None, 0)
            await asyncio.gather(g.send(np.ones(1), 0, tag=1), zero.recv(np.zeros(1), g.rank, tag=1))
        # all_reduce (recursive doubling), ranks 2 and 3 holding back: ranks 0 and
        # 1 finish round 1 together, then wait for 2 and 3 respectively. Each
        # token follows its sender's round-1 message; the receiver's all_reduce
        # is woken by that message before the token's receive completes, so it
        # is in round 2 once the tokens are in.
        x = [np.ones(4) for _ in ranks]
        reduced = [Work.start(lambda g=g: g.all_reduce(x[g.rank]), "all_reduce", [x[g.rank]], rank=g.rank)
                   for g in (zero, one)]
        await asyncio.gather(zero.send(np.ones(1), 1, tag=2), one.recv(np.zeros(1), 0, tag=2),
                             one.send(np.ones(1), 0, tag=2), zero.recv(np.zeros(1), 1, tag=2))
        # A subgroup without rank 1, whose group ranks differ from the global ones.
        trio = [g.new_group([0, 2, 3], name="trio") for g in ranks]
        alone = Work.start(lambda: trio[0].all_to_all_single(np.empty(3), np.ones(3)), "all_to_all_single", rank=0)

        works = (gathered, *reduced, alone)
        errors = await asyncio.gather(*(asyncio.to_thread(work.wait, 0.3) for work in works), return_exceptions=True)
        assert all(isinstance(e, OperationTimeoutError) for e in errors), errors
        assert [str(e) for e in errors] == [
            "rank 0: gather(dst=0, float64[2]) (call #1 in group 'local4') Timed out after 0.3 s "
            "(Work.wait timeout); still waiting for rank 2",
            "rank 0: all_reduce(sum, float64[4]) (call #2 in group 'local4') Timed out after 0.3 s "
            "(Work.wait timeout); still waiting for rank 2",
            "rank 1: all_reduce(sum, float64[4]) (call #2 in group 'local4') Timed out after 0.3 s "
            "(Work.wait timeout); still waiting for rank 3",
            "rank 0: all_to_all_single(float64) (call #1 in group 'trio') Timed out after 0.3 s "
            "(Work.wait timeout); still waiting for ranks [1, 2] (global [2, 3])",
        ]

        # Nothing was aborted: the late ranks make their calls and every Work completes.
        await two.gather(np.full(2, 2.0), None, 0)
        await asyncio.gather(two.all_reduce(x[2]), three.all_reduce(x[3]))
        await asyncio.gather(*(t.all_to_all_single(np.empty(3), np.ones(3)) for t in trio[2:]))
        for work in works:
            assert await asyncio.to_thread(work.wait, 10) is True
        assert all(v.tolist() == [4.0] * 4 for v in x)
        assert [s.tolist() for s in slots] == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]


async def test_point_to_point_work_wait_names_the_peers() -> None:
    async with local_world(3) as (a, b, c):
        anyone = b.irecv(np.zeros(1), None, tag=4)
        with pytest.raises(OperationTimeoutError) as info:
            await asyncio.to_thread(anyone.wait, 0.2)
        assert str(info.value) == ("rank 1: recv from any rank (tag 4, group 'local3') Timed out after "
                                   "0.2 s (Work.wait timeout); still waiting for ranks [0, 2]")
        # A send that the receiver does not read: the receiver's loop stops reading.
        loop = asyncio.get_running_loop()
        receiver = b.engine._connections[0]
        loop.remove_reader(receiver._fd)
        try:
            sending = a.isend(np.ones(4 << 20), 1, tag=8)
            with pytest.raises(OperationTimeoutError) as info:
                await asyncio.to_thread(sending.wait, 0.2)
        finally:
            loop.add_reader(receiver._fd, receiver._read)
        assert str(info.value) == ("rank 0: send to rank 1 (tag 8, group 'local3') Timed out after 0.2 s "
                                   "(Work.wait timeout); still sending to rank 1")
        got = np.zeros(4 << 20)
        await asyncio.gather(b.recv(got, 0, tag=8), c.send(np.ones(1), 1, tag=4))
        assert await asyncio.to_thread(sending.wait, 10) is True and got[-1] == 1.0
        assert await asyncio.to_thread(anyone.wait, 10) is True and anyone.value() == 2


async def test_monitored_barrier_names_the_missing_rank() -> None:
    async with local_world(3) as ranks:
        results = await asyncio.gather(*(g.monitored_barrier(TIMEOUT) for g in ranks[:2]), return_exceptions=True)
        assert all(isinstance(r, OperationTimeoutError) for r in results), results
        assert "rank 2 failed to pass it within 0.3 s" in str(results[0])


# -- the facade, in rank processes --------------------------------------------


def facade_timeouts() -> dict:
    dist.init_process_group(timeout=timedelta(seconds=1))
    rank = dist.get_rank()
    out: dict = {}
    start = time.monotonic()
    try:
        dist.recv(np.zeros(1), 1 - rank, tag=9)  # both wait: nobody sends
    except OperationTimeoutError as exc:
        out["recv"] = (str(exc), time.monotonic() - start)
    dist.barrier()
    x = np.ones(3, dtype=np.float32)
    if rank == 0:
        work = dist.all_reduce(x, async_op=True)
        try:
            work.wait(timeout=0.2)
        except OperationTimeoutError as exc:
            out["wait"] = str(exc)
        dist.send(np.ones(1), 1, tag=10)  # now rank 1 may come
        out["completed"] = work.wait()  # rank 1 arrives: the operation goes on
    else:
        dist.recv(np.zeros(1), 0, tag=10)
        dist.all_reduce(x)
    out["x"] = x.tolist()
    return out


def test_facade_operations_honour_the_group_timeout_and_work_wait() -> None:
    zero, one = spawn(2, facade_timeouts, timeout=60)
    for rank, result in enumerate((zero, one)):
        message, took = result["recv"]
        assert message == (f"rank {rank}: recv from rank {1 - rank} (tag 9, group 'world') Timed out after 1 s; "
                           f"still waiting for rank {1 - rank}")
        assert 1.0 <= took < 3.0
    assert zero["wait"] == ("rank 0: all_reduce(sum, float32[3]) (call #2 in group 'world') Timed out after "
                            "0.2 s (Work.wait timeout); still waiting for rank 1")
    assert zero["completed"] is True and zero["x"] == one["x"] == [2.0, 2.0, 2.0]


def _wait_error(work: dist.Work, seconds: float = 0.3) -> str:
    """The message of ``work.wait(seconds)``, which must give up."""
    try:
        work.wait(timeout=seconds)
    except OperationTimeoutError as exc:
        return str(exc)
    return "completed"


def facade_work_waits() -> dict:
    """Ranks 2 and 3 hold back until ranks 0 and 1 have seen their waits give up."""
    dist.init_process_group(timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    x = np.ones(3, dtype=np.float32)
    mine = np.full(2, float(rank))
    out: dict = {}
    if rank >= 2:
        dist.recv(np.zeros(1), 0, tag=4)  # rank 0's go
        dist.all_reduce(x)
        dist.gather(mine, dst=0)
        dist.send(np.full(1, float(rank)), 0, tag=3 + rank)  # rank 2: tag 5 (a batch's irecv), rank 3: tag 6
        return out
    other = 1 - rank
    reduced = dist.all_reduce(x, async_op=True)
    # Each token follows its sender's round-1 message of the all_reduce on the
    # same stream; the all_reduce is woken by that message first, so it is in
    # round 2 (waiting for rank 2 or 3) once this rank has the token.
    token = dist.isend(np.ones(1), other, tag=1)
    dist.recv(np.zeros(1), other, tag=1)
    token.wait()
    out["all_reduce"] = _wait_error(reduced)
    if rank == 1:
        dist.gather(mine, dst=0)
        dist.send(np.ones(1), 0, tag=2)  # after its part of the gather
        dist.recv(np.zeros(1), 0, tag=7)  # the isend of rank 0's batch
    else:
        slots = [np.zeros(2) for _ in range(4)]
        gathered = dist.gather(mine, slots, dst=0, async_op=True)
        dist.recv(np.zeros(1), 1, tag=2)
        out["gather"] = _wait_error(gathered)
        got, anyone = np.zeros(1), np.zeros(1)
        batch = dist.batch_isend_irecv([dist.P2POp(dist.irecv, got, 2, tag=5), dist.P2POp(dist.isend, np.ones(1), 1, tag=7)])
        out["batch"] = _wait_error(batch[0])
        from_any = dist.irecv(anyone, tag=6)
        out["any"] = _wait_error(from_any)
        for late in (2, 3):
            dist.send(np.ones(1), late, tag=4)
        assert gathered.wait() and all(work.wait() for work in batch) and from_any.wait()
        out["gathered"] = [slot.tolist() for slot in slots]
        out["p2p"] = (got.tolist(), anyone.tolist(), from_any.source_rank())
    assert reduced.wait()
    out["x"] = x.tolist()
    return out


def test_facade_work_wait_names_the_call_the_group_and_exactly_the_ranks_still_awaited() -> None:
    results = spawn(4, facade_work_waits, timeout=90)
    zero, one = results[0], results[1]
    expected = "Timed out after 0.3 s (Work.wait timeout); still waiting for"
    assert zero["all_reduce"] == f"rank 0: all_reduce(sum, float32[3]) (call #1 in group 'world') {expected} rank 2"
    assert one["all_reduce"] == f"rank 1: all_reduce(sum, float32[3]) (call #1 in group 'world') {expected} rank 3"
    assert zero["gather"] == f"rank 0: gather(dst=0, float64[2]) (call #2 in group 'world') {expected} ranks [2, 3]"
    assert zero["batch"] == f"rank 0: recv from rank 2 (tag 5, group 'world') {expected} rank 2"
    assert zero["any"] == f"rank 0: recv from any rank (tag 6, group 'world') {expected} ranks [1, 2, 3]"
    # The waits aborted nothing: every operation completed once the late ranks came.
    assert zero["x"] == one["x"] == [4.0] * 3
    assert zero["gathered"] == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]
    assert zero["p2p"] == ([2.0], [3.0], 3)

"""Timeouts: every operation honours its group's timeout and ``Work.wait(timeout)``.

An expired operation raises OperationTimeoutError (a TimeoutError) whose
message names the operation, the group, the collective call number and the
peer it was still waiting for; the other members learn of it through the
ABORT and fail at once, and the group is usable again once every member has
made the call.
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
    assert re.search(r"still (waiting for|sending to) rank \d|relayed by rank \d", message), message


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
            _check_message(error, name, 2, "local3")  # call #1 was init_world's barrier
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
                           match=rf"rank 1: recv from rank 0 \(tag 5, group 'local2'\) did not complete within {TIMEOUT:g} s"):
            await b.recv(np.zeros(1), 0, tag=5)
        assert TIMEOUT <= time.monotonic() - start < TIMEOUT + 2
        with pytest.raises(OperationTimeoutError, match=r"recv from any rank \(tag 6"):
            await b.irecv(np.zeros(1), None, tag=6)  # a Work: the group's timeout too
        # A send that the receiver does not read: the receiver's loop stops reading.
        loop = asyncio.get_running_loop()
        receiver = b._engine._connections[0]
        loop.remove_reader(receiver._fd)
        try:
            with pytest.raises(OperationTimeoutError, match=r"rank 0: send to rank 1 \(tag 7, group 'local2'\)"):
                await a.send(np.ones(4 << 20), 1, tag=7)
        finally:
            loop.add_reader(receiver._fd, receiver._on_readable)
        b.timeout = 30
        got = np.zeros(4 << 20)
        await b.recv(got, 0, tag=7)  # the send was not withdrawn: it completes
        assert got[0] == 1.0


async def test_work_wait_timeout_bounds_only_the_wait() -> None:
    async with local_world(2) as (a, b):
        out = np.zeros(2)
        work = b.irecv(out, 0, tag=3)
        start = time.monotonic()
        with pytest.raises(OperationTimeoutError, match=r"recv from rank 0 \(tag 3, group 'local2'\) did not "
                                                        r"complete within 0.2 s \(Work.wait timeout\)"):
            await asyncio.to_thread(work.wait, 0.2)
        assert 0.2 <= time.monotonic() - start < 2
        await a.send(np.arange(2.0), 1, tag=3)
        assert await asyncio.to_thread(work.wait, timedelta(seconds=5)) is True
        assert out.tolist() == [0.0, 1.0]


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
        out["completed"] = work.wait()  # rank 1 arrives: the operation goes on
    else:
        time.sleep(0.5)
        dist.all_reduce(x)
    out["x"] = x.tolist()
    return out


def test_facade_operations_honour_the_group_timeout_and_work_wait() -> None:
    zero, one = spawn(2, facade_timeouts, timeout=60)
    for rank, result in enumerate((zero, one)):
        message, took = result["recv"]
        assert message == f"rank {rank}: recv from rank {1 - rank} (tag 9, group 'world') did not complete within 1 s"
        assert 1.0 <= took < 3.0
    message = zero["wait"]
    assert message.startswith("all_reduce") and "group 'world'" in message, message
    assert message.endswith("did not complete within 0.2 s (Work.wait timeout)"), message
    assert zero["completed"] is True and zero["x"] == one["x"] == [2.0, 2.0, 2.0]

"""Cancelling an operation of the await API: the cancelled rank sees
``asyncio.CancelledError`` (never a timeout), the other members of a
collective fail at once with OperationCancelledError, and the group goes on.

All ranks run in one loop over real loopback sockets (``local_world``).
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from asyncdist.errors import OperationCancelledError
from asyncdist.group.work import Work
from asyncdist.testing import local_world


async def _started(task: asyncio.Task) -> None:
    """Let ``task`` run up to its first wait (it posts before it awaits)."""
    await asyncio.sleep(0)
    assert not task.done()


async def test_a_cancelled_recv_raises_cancelled_error_and_takes_no_later_message() -> None:
    async with local_world(2, timeout=10) as (r0, r1):
        lost = np.zeros(3)
        waiting = asyncio.create_task(r1.recv(lost, 0))
        await _started(waiting)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

        got = np.zeros(3)
        await asyncio.gather(r0.send(np.arange(3.0), 1), r1.recv(got, 0))
        assert got.tolist() == [0.0, 1.0, 2.0]
        assert lost.tolist() == [0.0, 0.0, 0.0]


async def test_a_cancelled_collective_fails_the_other_members_with_operation_cancelled() -> None:
    async with local_world(3, timeout=10) as ranks:
        xs = [np.full(4, float(r + 1)) for r in range(3)]
        cancelled = asyncio.create_task(ranks[0].all_reduce(xs[0]))
        other = asyncio.create_task(ranks[1].all_reduce(xs[1]))
        await _started(cancelled)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        with pytest.raises(OperationCancelledError, match="cancelled on rank 0"):
            await other
        # The rank that had not entered the call yet fails it too when it does
        # (the call's number is spent on every member), then all go on.
        with pytest.raises(OperationCancelledError, match="cancelled on rank 0"):
            await ranks[2].all_reduce(xs[2])

        ys = [np.full(4, float(r + 1)) for r in range(3)]
        await asyncio.gather(*(g.all_reduce(y) for g, y in zip(ranks, ys)))
        assert all(y.tolist() == [6.0] * 4 for y in ys)


async def test_work_wait_after_cancellation_raises_cancelled_error() -> None:
    async with local_world(2, timeout=10) as (r0, r1):
        work = Work.start(lambda: r1.recv(np.zeros(1), 0), "recv from rank 0", rank=1)
        await _started(work.future)
        work.future.cancel()
        with pytest.raises(asyncio.CancelledError):
            await work
        with pytest.raises(asyncio.CancelledError, match="recv from rank 0 was cancelled"):
            await asyncio.to_thread(work.wait, 5.0)
        assert isinstance(work.exception(), asyncio.CancelledError)
        assert work.is_completed() and not work.is_success()

        got = np.zeros(1)
        await asyncio.gather(r0.send(np.ones(1), 1), r1.recv(got, 0))
        assert got.tolist() == [1.0]


async def test_a_cancelled_irecv_work_takes_no_later_message() -> None:
    async with local_world(2, timeout=10) as (r0, r1):
        lost = np.zeros(2)
        work = r1.irecv(lost, 0)
        work.future.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.to_thread(work.wait, 5.0)

        got = np.zeros(2)
        await asyncio.gather(r0.send(np.ones(2), 1), r1.recv(got, 0))
        assert got.tolist() == [1.0, 1.0]
        assert lost.tolist() == [0.0, 0.0]


async def test_a_cancelled_works_torch_future_fails_instead_of_never_completing() -> None:
    torch = pytest.importorskip("torch")
    async with local_world(2, timeout=10) as (r0, r1):
        work = Work.start(lambda: r1.recv(np.zeros(1), 0), "recv from rank 0", rank=1)
        future = work.get_future()
        assert isinstance(future, torch.futures.Future)
        await _started(work.future)
        work.future.cancel()
        with pytest.raises(asyncio.CancelledError):
            await work
        # Completed by the done-callback, which ran as the cancelled task ended.
        assert future.done()
        with pytest.raises(OperationCancelledError, match="recv from rank 0 was cancelled"):
            future.wait()
        # One made after the cancellation fails alike.
        with pytest.raises(OperationCancelledError, match="recv from rank 0 was cancelled"):
            work.get_future().wait()

        got = np.zeros(1)
        await asyncio.gather(r0.send(np.ones(1), 1), r1.recv(got, 0))
        assert got.tolist() == [1.0]

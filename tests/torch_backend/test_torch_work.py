"""TorchWork.ran: a call torch waits on at once runs to completion in the calling thread.

No ranks are needed: the operations here are coroutines on a LoopThread of
their own, so what is checked is where they ran and what their Work says.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Iterator

import pytest

from asyncdist.errors import PeerLostError
from asyncdist.loop import thread as loop_thread
from asyncdist.loop.thread import LoopThread

torch = pytest.importorskip("torch")

from asyncdist.torch_backend.work import TorchWork  # noqa: E402  (needs torch)


@pytest.fixture
def portal(monkeypatch: pytest.MonkeyPatch) -> Iterator[LoopThread]:
    # The daemon never takes the free loop for being idle: the call must find it free, however slow the machine.
    monkeypatch.setattr(loop_thread, "IDLE_GRACE", 3600.0)
    thread = LoopThread("test-torch-work")
    yield thread
    thread.stop()


def test_a_call_run_now_runs_in_the_calling_thread_without_a_task(portal: LoopThread) -> None:
    tensor = torch.zeros(3)
    seen: dict = {}

    async def operation() -> None:
        seen["thread"] = threading.get_ident()
        seen["task"] = asyncio.current_task()
        await asyncio.sleep(0)  # one real turn of the loop
        tensor.add_(2.0)

    work = TorchWork.ran(portal, operation, "all_reduce", [tensor])
    assert seen == {"thread": threading.get_ident(), "task": None}
    assert work.is_completed() and work.is_success() and work.exception() is None
    assert work.wait() is True
    assert work.result()[0].tolist() == [2.0, 2.0, 2.0]
    assert work.get_future().wait()[0] is tensor
    assert not portal.loop._ready  # nothing left queued for a loop that may not turn again


def test_the_error_of_a_call_run_now_is_raised_by_wait_and_fails_its_future(portal: LoopThread) -> None:
    lost = PeerLostError("rank 0 lost rank 1 (connection closed)", rank=1)

    async def operation() -> None:
        await asyncio.sleep(0)
        raise lost

    work = TorchWork.ran(portal, operation, "all_reduce", [])
    assert work.is_completed() and not work.is_success() and work.exception() is lost
    with pytest.raises(PeerLostError, match="lost rank 1") as raised:
        work.wait()
    assert raised.value is lost
    with pytest.raises(RuntimeError, match="PeerLostError: rank 0 lost rank 1"):
        work.get_future().wait()

"""Waiting for device events (asyncdist/gpu/poll.py) without a GPU.

The events here are ``threading.Event`` s that another thread sets: an adapter
whose ``synchronize`` blocks a worker thread, as torch's and CuPy's do. The
fake device of the other tests is only ever polled, so these are the tests of
the worker-thread path that the torch backend and the await API take on a GPU.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from asyncdist.errors import OperationTimeoutError
from asyncdist.gpu import poll


class ThreadEvents:
    """A DeviceAdapter's event part: events complete when another thread sets them."""

    name = "threads"

    def __init__(self, thread_waits: bool = True) -> None:
        self.thread_waits = thread_waits
        self.synchronized: list[str] = []  # the threads that blocked on an event
        self.blocked = threading.Event()  # a worker blocks on an event
        self.polled = threading.Event()  # the loop looked more times than its immediate re-checks
        self._queries = 0

    def query(self, event: threading.Event) -> bool:
        self._queries += 1
        if self._queries > poll.SPIN_POLLS:
            self.polled.set()
        return event.is_set()

    def synchronize(self, event: threading.Event) -> None:
        self.synchronized.append(threading.current_thread().name)
        self.blocked.set()
        if not event.wait(30):
            raise RuntimeError("event never set")


def _set_once(ready: threading.Event, *events: threading.Event) -> threading.Thread:
    """Set ``events`` from another thread once ``ready`` is (no sleeps)."""

    def run() -> None:
        if ready.wait(30):
            for event in events:
                event.set()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


class Deadline:
    """A device operation's deadline, as an Operation gives it (a DeviceWait)."""

    def __init__(self, seconds: float) -> None:
        self.deadline = asyncio.get_running_loop().time() + seconds

    def timeout_error(self) -> Exception:
        return OperationTimeoutError("all_reduce (test): the device did not finish its work")


async def _wait(adapter: ThreadEvents, events: list[threading.Event], seconds: float = 30) -> None:
    await poll.wait_events(adapter, events, operation=Deadline(seconds))  # type: ignore[arg-type]


async def test_a_pending_event_is_waited_for_by_a_worker_thread() -> None:
    adapter, events = ThreadEvents(), [threading.Event(), threading.Event()]
    setter = _set_once(adapter.blocked, *events)
    await _wait(adapter, events)
    setter.join()
    assert adapter.synchronized and all(name.startswith("asyncdist-device-events") for name in adapter.synchronized)


async def test_complete_events_need_no_thread() -> None:
    adapter, event = ThreadEvents(), threading.Event()
    event.set()
    await _wait(adapter, [event])
    assert adapter.synchronized == []


async def test_a_wait_past_its_deadline_times_out_with_the_operation_named() -> None:
    adapter, event = ThreadEvents(), threading.Event()
    with pytest.raises(OperationTimeoutError, match=r"all_reduce \(test\): the device did not finish its work"):
        await _wait(adapter, [event], seconds=0.2)
    event.set()  # lets the worker go


async def test_a_library_error_in_the_worker_reaches_the_caller() -> None:
    class Failing(ThreadEvents):
        def synchronize(self, event: threading.Event) -> None:
            raise RuntimeError("CUDA error: an illegal memory access")

    with pytest.raises(RuntimeError, match="illegal memory access"):
        await _wait(Failing(), [threading.Event()])


async def test_an_adapter_without_thread_waits_is_polled() -> None:
    adapter, event = ThreadEvents(thread_waits=False), threading.Event()
    setter = _set_once(adapter.polled, event)
    await _wait(adapter, [event])
    setter.join()
    assert adapter.synchronized == [] and adapter.polled.is_set()

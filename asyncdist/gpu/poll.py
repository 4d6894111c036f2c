"""Waiting for device events from the event loop, without blocking it.

A CUDA event can be waited for by blocking a thread (``synchronize``) or by
asking whether it is complete (``query``). The loop must never block. So
asyncdist first re-checks a few times (``sleep(0)``: a copy of a few
hundred KiB ends within them). An event still pending then is waited for
in one of two ways:

* **polled**, with sleeps that double from 50 us to 2 ms, where a blocking
  facade call drives the loop in its own thread and spins
  (:mod:`asyncdist.loop.turns`): the spinning loop runs those timers on
  time, and the caller's thread is waiting anyway;
* **by a worker thread** that blocks on the event (the libraries release
  the GIL while they wait) and wakes the loop, everywhere else (the
  facade's loop thread, the torch backend, the await API, a facade that
  does not spin). A loop that sleeps does so in whole milliseconds (asyncio
  rounds a timer's wait up), so a sleeping poll woke about 1 ms late per
  copy: on an H200 the torch backend's 1 MiB all_reduce of a CUDA tensor
  took 2.45 ms polling and 1.85 ms with a worker; the facade's, which
  spins, 1.05 ms polling and 1.23 ms with a worker.

NCCL's waits always poll: they check NCCL's asynchronous errors between
looks, and a thread blocked on a hung collective's event would never
return. The fake device of the tests is polled too (its streams run on
the loop thread when queried).

Nothing else here: what to wait for and what to do next is the caller's.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

from ..engine.operation import arm_deadline
from ..transport.spinning import may_spin, spin_seconds
from .device import DeviceAdapter
from .seams import DeviceWait

__all__ = ["wait_events", "SPIN_POLLS", "FIRST_SLEEP", "MAX_SLEEP", "WAITER_THREADS"]

#: Re-checks before the first timed sleep (each yields to the loop once).
SPIN_POLLS = 8
#: First and largest sleep between checks, in seconds.
FIRST_SLEEP = 50e-6
MAX_SLEEP = 2e-3
#: Worker threads that block on events (a pipelined call waits for one chunk at a time).
WAITER_THREADS = 4

_waiters: ThreadPoolExecutor | None = None
_waiters_lock = threading.Lock()


def _waiter_pool() -> ThreadPoolExecutor:
    global _waiters
    with _waiters_lock:
        if _waiters is None:
            _waiters = ThreadPoolExecutor(WAITER_THREADS, thread_name_prefix="asyncdist-device-events")
        return _waiters


def _synchronize_all(adapter: DeviceAdapter, events: Sequence[Any]) -> None:
    for event in events:
        adapter.synchronize(event)


async def wait_events(
    adapter: DeviceAdapter,
    events: Sequence[Any],
    *,
    operation: DeviceWait,
    check: Callable[[], None] | None = None,
) -> None:
    """Return once every event of ``events`` is complete (loop thread).

    Args:
        adapter: the adapter that made the events.
        events: events, waited for in order.
        operation: the device operation whose deadline bounds the wait, on the
            one timer of every operation (:func:`~asyncdist.engine.operation.arm_deadline`).
        check: called between polls; raises to abandon the wait (NCCL's
            asynchronous errors). Given, the wait polls.

    Raises:
        OperationTimeoutError: not complete by the operation's deadline.
        Exception: the library's error, from a worker's ``synchronize``.
    """
    loop = asyncio.get_running_loop()
    pending = list(events)
    for _ in range(SPIN_POLLS):
        while pending and adapter.query(pending[0]):
            del pending[0]
        if not pending:
            return
        if check is not None:
            check()
        await asyncio.sleep(0)
    expired = loop.create_future()  # failed by the timer at the deadline
    disarm = arm_deadline(expired, operation.deadline, operation.timeout_error)
    try:
        if check is None and adapter.thread_waits and not _spun_by_caller():
            waiter = loop.run_in_executor(_waiter_pool(), _synchronize_all, adapter, pending)
            await asyncio.wait((waiter, expired), return_when=asyncio.FIRST_COMPLETED)
            if not waiter.done():
                expired.result()  # raises the timeout error the timer set
            waiter.result()
            return
        delay = FIRST_SLEEP
        for event in pending:
            while not adapter.query(event):
                if check is not None:
                    check()
                if expired.done():
                    expired.result()  # raises the timeout error the timer set
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_SLEEP)
    finally:
        disarm()


def _spun_by_caller() -> bool:
    """Whether a blocking facade call spins this loop in its own thread: it runs
    the operation without a Task (:mod:`asyncdist.loop.turns`), and spins if allowed."""
    return asyncio.current_task() is None and may_spin() and spin_seconds() > 0

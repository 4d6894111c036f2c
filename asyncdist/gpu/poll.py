"""Waiting for device events from the event loop, without blocking it.

A CUDA event can be waited for by blocking a thread (``synchronize``) or by
asking whether it is complete (``query``). The loop must never block, and a
thread per wait would cost a thread hop per operation, so asyncdist polls:
a few immediate re-checks (``sleep(0)``: a copy of a few hundred KiB ends
within them), then sleeps that double from 50 us to 2 ms, so a long kernel
costs at most ~500 wake-ups a second and a short one about its own length.

Nothing else here: what to wait for and what to do next is the caller's.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Sequence

from ..errors import OperationTimeoutError
from .device import DeviceAdapter

__all__ = ["wait_events", "SPIN_POLLS", "FIRST_SLEEP", "MAX_SLEEP"]

#: Re-checks before the first timed sleep (each yields to the loop once).
SPIN_POLLS = 8
#: First and largest sleep between checks, in seconds.
FIRST_SLEEP = 50e-6
MAX_SLEEP = 2e-3


async def wait_events(
    adapter: DeviceAdapter,
    events: Sequence[Any],
    *,
    deadline: float,
    what: str,
    check: Callable[[], None] | None = None,
) -> None:
    """Return once every event of ``events`` is complete (loop thread).

    Args:
        adapter: the adapter that made the events.
        events: events, waited for in order.
        deadline: loop time after which to give up.
        what: the operation, for the timeout's message.
        check: called between polls; raises to abandon the wait (NCCL's
            asynchronous errors).

    Raises:
        OperationTimeoutError: not complete by ``deadline``.
    """
    loop = asyncio.get_running_loop()
    polls, delay = 0, FIRST_SLEEP
    for event in events:
        while not adapter.query(event):
            if check is not None:
                check()
            if loop.time() >= deadline:
                raise OperationTimeoutError(f"{what}: the device did not finish its work in time (timeout)")
            if polls < SPIN_POLLS:
                polls += 1
                await asyncio.sleep(0)
            else:
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_SLEEP)

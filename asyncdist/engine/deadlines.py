"""``Deadlines``: the one timer of a rank's operations.

Every :class:`~asyncdist.engine.operation.Operation` has a deadline and may
have a hang warning before it. Arming an event-loop timer for each wait and
cancelling it when the wait ends cost about fifteen Python calls per
operation, more than the rest of a small operation's bookkeeping; yet
almost every operation completes long before its deadline. So a rank keeps
its open operations in one dict (in the order they opened, a dict write
each) and one timer, armed for the earliest moment any of them may need it.
An operation that opens with an earlier moment than the timer's re-arms it;
one that closes only leaves the dict. When the timer fires, each open
operation warns or expires if its time has come (:meth:`Operation.due
<asyncdist.engine.operation.Operation.due>`), and the timer is armed again for
the earliest time left. In a steady stream of operations that all take the
group's timeout, the timer is armed once and fires once per timeout, not
once per operation.

Deadlines are times on the loop's clock. Where that clock is
``time.monotonic`` (asyncio's own loop, uvloop), an operation reads it
directly, which costs no Python call; on any other clock (the virtual time
of :mod:`asyncdist.testing.virtual_time`) it reads ``loop.time()``.

Loop thread only.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Callable, Protocol

__all__ = ["Deadlines", "Timed", "clock_of"]

log = logging.getLogger("asyncdist.engine.deadlines")


class Timed(Protocol):
    """What the timer asks of an open operation."""

    def due(self, now: float) -> float:
        """Warn or expire if its time has come by ``now``; the next time it needs the timer (inf: none)."""
        ...


def clock_of(loop: asyncio.AbstractEventLoop) -> Callable[[], float]:
    """The cheapest function that reads ``loop``'s clock."""
    if type(loop).time is asyncio.BaseEventLoop.time or type(loop).__module__ == "uvloop":
        return time.monotonic
    return loop.time


class Deadlines:
    """The open operations of one rank, and the one timer that serves them.

    Attributes:
        open: the open operations, as keys (insertion order: the order they
            opened). An operation adds itself as it opens and removes itself
            as it closes, without a call.
        next_at: when the timer fires (loop time; inf: it is not armed).
        clock: reads the loop's clock, on which every deadline is a time.

    The rank's loop is the running one when the timer is first armed, unless
    :meth:`bind` named it before.
    """

    __slots__ = ("open", "next_at", "clock", "_timer", "_loop")

    def __init__(self) -> None:
        self.open: dict[Timed, None] = {}
        self.clock = time.monotonic
        self.next_at = math.inf
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Serve the deadlines with ``loop``'s timer and clock (before any is armed)."""
        self._loop, self.clock = loop, clock_of(loop)

    def arm(self, when: float) -> None:
        """Fire at ``when`` (loop time), sooner than the timer is armed for now."""
        if self._timer is not None:
            self._timer.cancel()
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        self._timer = loop.call_at(when, self._fire)
        self.next_at = when

    def _fire(self) -> None:
        self._timer, self.next_at = None, math.inf
        assert self._loop is not None
        now = self._loop.time()
        soonest = math.inf
        for operation in list(self.open):
            try:
                when = operation.due(now)
            except Exception:  # one operation's bug must not stop the others' timer
                log.exception("the deadline timer failed on %r", operation)
                when = math.inf
            if when == math.inf:
                self.open.pop(operation, None)
            elif when < soonest:
                soonest = when
        if soonest < self.next_at:
            self.arm(soonest)

    def stop(self) -> None:
        """Disarm the timer (the engine is closing); operations still open are not expired."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self.next_at = None, math.inf

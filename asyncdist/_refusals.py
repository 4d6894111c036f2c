"""Rate-limited logging of refused connections, for every listener of a process.

A listener that anyone can reach (a rank's peer port, the TCP store) logs each
connection it refuses, because one refused stranger is worth a line: it is
often a misconfigured job. A flood of them is not worth a million lines: 1,000
bad connections wrote 1,000-2,000 lines, and a busy accept loop under
``EMFILE`` wrote 7.5 million. So a :class:`RefusalLog` writes the first
:data:`FULL_LINES` refusals of a period in full and counts the rest, and writes
one summary line with the counts, by kind, at the end of each
:data:`SUMMARY_SECONDS` period in which it counted any. While refusals keep
coming faster than that, it stays in summary mode: at most one line per period.
After a quiet period (nothing counted), the next refusals are written in full
again.

It must not know sockets, frames or handshakes: callers say what kind of
refusal it was (a short noun: "refused", "timed out", "evicted") and pass the
full line. It lives beside ``errors.py`` because both the transport and the
rendezvous layer (the store) use it, and the rendezvous layer is below the
transport.

Loop thread only (of whichever loop the listener runs on): the summary is
written by a timer on the running loop.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Any, Callable

__all__ = ["FULL_LINES", "SUMMARY_SECONDS", "RefusalLog"]

#: Refusals written in full per period before the rest are only counted.
FULL_LINES = 5
#: Seconds between summary lines while refusals are being counted.
SUMMARY_SECONDS = 10.0


class RefusalLog:
    """Writes refusals to ``logger``: a few in full, then a summary per period.

    Args:
        logger: where the lines go (WARNING).
        who: names the listener in summaries, e.g. ``"rank 0"``.
        clock: seconds, monotonic (a test may pass a fake).
        schedule: ``call_later(delay, callback)``; None uses the running loop's.

    Example::

        refusals = RefusalLog(log, "rank 0")
        refusals.note("timed out", "rank %d: dropped a connection from %s", 0, peer)
    """

    def __init__(
        self,
        logger: logging.Logger,
        who: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        schedule: Callable[[float, Callable[[], None]], Any] | None = None,
    ) -> None:
        self._logger = logger
        self._who = who
        self._clock = clock
        self._schedule = schedule
        self._period_start = -float("inf")
        self._written = 0  # full lines this period
        self._counted: collections.Counter[str] = collections.Counter()
        self._summary_pending = False
        self.total: collections.Counter[str] = collections.Counter()

    def note(self, kind: str, msg: str, *args: object) -> None:
        """Record one refusal of ``kind``; write ``msg % args`` in full if the
        period's budget allows, else count it for the summary."""
        self.total[kind] += 1
        now = self._clock()
        if now - self._period_start >= SUMMARY_SECONDS and not self._summary_pending:
            self._period_start = now  # a new period, after a quiet one
            self._written = 0
        if self._written < FULL_LINES and not self._summary_pending:
            self._written += 1
            self._logger.warning(msg, *args)
            return
        self._counted[kind] += 1
        if not self._summary_pending:
            self._summary_pending = True
            delay = max(0.0, self._period_start + SUMMARY_SECONDS - now)
            schedule = self._schedule or asyncio.get_running_loop().call_later
            schedule(delay, self._summarise)

    def _summarise(self) -> None:
        """End a period: write its counts, and stay in summary mode if it had any."""
        counted, self._counted = self._counted, collections.Counter()
        self._period_start = self._clock()
        self._summary_pending = False
        if not counted:
            return
        parts = ", ".join(f"{n} {kind}" for kind, n in counted.most_common())
        self._logger.warning(
            "%s: %d more connections refused in the last %g s (%s); totals so far: %s",
            self._who, sum(counted.values()), SUMMARY_SECONDS, parts,
            ", ".join(f"{n} {kind}" for kind, n in self.total.most_common()),
        )
        # Still flooded: count the next refusals too, until a quiet period.
        self._written = FULL_LINES

    def flush(self) -> None:
        """Write the pending summary now (at close)."""
        if self._counted:
            self._summarise()

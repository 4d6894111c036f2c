"""What a rank waiting in the rendezvous tells its user, and when.

Init never waits silently. A rank that has waited :data:`FIRST_REPORT_SECONDS`
for other ranks logs one line saying where it waits, for whom and how long
it has left, then again every ``ASYNCDIST_INIT_REPORT_EVERY`` seconds::

    rank 0: waiting at tcp://127.0.0.1:29500 for ranks [2, 3] of 4 (10 s so far; timeout in 29 min 50 s)

Once every rank has published its address, the ranks connect to each
other; a rank still waiting for some of them to connect says so too::

    rank 0: waiting at tcp://127.0.0.1:29500 for rank 3 of 4 to connect (10 s so far; timeout in 29 min 50 s)

A rank that cannot reach the store yet says so in the same rhythm, with
the OS's reason, while its client keeps retrying::

    rank 1: cannot reach the store at tcp://10.0.0.1:29500: [Errno 111] Connection refused; retrying (10 s so far; timeout in 29 min 50 s)

The lines are WARNINGs on the ``asyncdist.rendezvous`` logger, so they reach
stderr without any logging set up (Python's last-resort handler prints
warnings); under ``asyncdist-run`` they arrive behind the worker's prefix,
and a launcher waiting for node 0's store says so in the same rhythm.

This module decides when a report is due and words it; it reads no store
and owns no clock (the caller passes ``time.monotonic()`` readings).
"""

from __future__ import annotations

import logging
import socket
import time
from typing import Callable, Mapping

from .. import settings

__all__ = ["WaitReports", "REPORT_EVERY_ENV", "FIRST_REPORT_SECONDS", "duration", "report_every", "ranks_text",
           "ranks_named", "until_listening"]

log = logging.getLogger("asyncdist.rendezvous")

#: Seconds between two reports of a rank still waiting; ``0`` turns them off.
REPORT_EVERY_ENV = settings.name_of("init_report_every")
#: The first report comes after this long (or after the interval, if shorter):
#: a healthy job's ranks usually arrive within a few seconds of each other.
FIRST_REPORT_SECONDS = 10.0


def duration(seconds: float) -> str:
    """Seconds as a person reads them: ``"10 s"``, ``"29 min 50 s"``, ``"2 h 5 min"``.

    Example:
        >>> duration(1790)
        '29 min 50 s'
    """
    whole = max(int(round(seconds)), 0)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    if minutes:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    return f"{secs} s"


def report_every(environ: Mapping[str, str] | None = None) -> float:
    """``ASYNCDIST_INIT_REPORT_EVERY`` in seconds (0: no reports), read as a wait
    starts (or from ``environ``).

    Raises:
        ConfigurationError: not a number >= 0.
    """
    return (settings.refresh() if environ is None else settings.Settings.from_environ(environ)).init_report_every


class WaitReports:
    """When a waiting rank reports, and the words of its report.

    Args:
        rank, world_size: who waits, in a job of how many.
        who: how the messages name the waiting process (None: ``rank <rank>``).
        where: the rendezvous's address as the user wrote it.
        start, deadline: ``time.monotonic()`` readings: when the rendezvous began
            and when it times out.
        environ: where ``ASYNCDIST_INIT_REPORT_EVERY`` is read.

    Raises:
        InvalidArgumentError: ``ASYNCDIST_INIT_REPORT_EVERY`` is not a number >= 0.
    """

    def __init__(self, rank: int, world_size: int, where: str, start: float, deadline: float,
                 environ: Mapping[str, str] | None = None, who: str | None = None) -> None:
        self.rank, self.world_size, self.where = rank, world_size, where
        self.who = who or f"rank {rank}"
        self._start, self._deadline = start, deadline
        self._every = report_every(environ)
        self._next = start + min(FIRST_REPORT_SECONDS, self._every) if self._every else float("inf")

    def due(self, now: float) -> bool:
        """True when a report should be logged now."""
        return now >= self._next

    @property
    def next_at(self) -> float:
        """When the next report is due (a ``time.monotonic()`` reading; inf: never)."""
        return self._next

    def report(self, now: float, waiting_for: list[int], to: str = "") -> None:
        """Log that this rank still waits for ``waiting_for`` (``to``: to do
        what, e.g. "connect"), and when the next report is due."""
        self._next = now + self._every
        log.warning("%s", self.message(now, waiting_for, to))

    def report_unreachable(self, now: float, error: OSError) -> None:
        """Log that the store cannot be reached yet, with the OS's reason."""
        self._next = now + self._every
        log.warning("%s: cannot reach the store at %s: %s; retrying (%s so far; timeout in %s)", self.who,
                    self.where, error, duration(now - self._start), duration(self._deadline - now))

    def message(self, now: float, waiting_for: list[int], to: str = "") -> str:
        """The report's words."""
        who = ranks_named(waiting_for)
        doing = f" to {to}" if to else ""
        return (f"{self.who}: waiting at {self.where} for {who} of {self.world_size}{doing} "
                f"({duration(now - self._start)} so far; timeout in {duration(self._deadline - now)})")


def ranks_named(ranks: list[int], noun: str = "rank") -> str:
    """``rank 2`` or ``ranks [2, 3]`` (``noun``: what they are ranks of, e.g. "node")."""
    return f"{noun} {ranks[0]}" if len(ranks) == 1 else f"{noun}s {ranks_text(ranks)}"


def ranks_text(ranks: list[int], shown: int = 16) -> str:
    """``[2, 3]``; a long list cut to its first ranks and a count."""
    if len(ranks) <= shown:
        return str(ranks)
    return f"[{', '.join(map(str, ranks[:shown]))}, ... and {len(ranks) - shown} more]"


# A refused probe is probed again after 2 ms, doubling up to 1 s: a rank that
# starts a moment before the store listens (ranks started together, or a
# destroy_process_group then init_process_group on one port) waits about as
# long as it was early, not a first 50 ms; a refused probe of this host costs
# some 50 us, and a store that stays away is probed once a second after 2 s.
_PROBE_FIRST_SECONDS, _PROBE_MAX_SECONDS = 0.002, 1.0


def until_listening(host: str, port: int, deadline: float, refused: Callable[[float, OSError], None]) -> None:
    """Return once ``host:port`` accepts a TCP connection (blocking), probing it
    again and again; ``refused(now, error)`` hears of each refusal before the
    next probe (to report the wait), ``deadline`` is ``time.monotonic()``'s.

    Raises:
        OSError: the last refusal, once ``deadline`` has passed.
    """
    delay = _PROBE_FIRST_SECONDS
    while True:
        try:
            socket.create_connection((host, port), timeout=max(min(deadline - time.monotonic(), 5.0), 0.01)).close()
            return
        except OSError as exc:
            now = time.monotonic()
            if now >= deadline:
                raise
            refused(now, exc)
            time.sleep(min(delay, deadline - now))
            delay = min(delay * 2, _PROBE_MAX_SECONDS)

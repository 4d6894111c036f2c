"""The flight recorder: each rank's last operations, kept cheaply, always on.

When a job hangs or the ranks disagree, the question is what each rank was
doing. The recorder keeps the answer: a ring of the rank's last ``N``
operations (``ASYNCDIST_TRACE_BUFFER``, default 2000; 0 turns it off), each
with its group and call number, the call's description as the group layer
wrote it ("all_reduce(sum, float32[4])"), the peers, the time of each state
change (posted, started, completed or failed) and the error. A dump
(:mod:`asyncdist.engine.dumps`) writes it as JSON; ``asyncdist-trace``
merges the dumps of every rank.

It must not know the names of collectives: the group layer hands it a
description and the engine stores it. Parsing the description (op, root,
dtype, shape, bytes) happens when a dump is read, never on the hot path.

Cost: an operation takes the next :class:`Entry` of a preallocated ring and
sets its fields (no formatting, no allocation unless the entry it would
reuse is still open, then a fresh one replaces it in the ring so that its
owner keeps a record of its own). Measured in docs/benchmarks.md ("Flight
recorder cost").

Loop thread only, except :meth:`Recorder.entries`, which takes a snapshot.
"""

from __future__ import annotations

import os
import time
from typing import Any

from ..errors import InvalidArgumentError

__all__ = ["Entry", "Recorder", "BUFFER_ENV", "POSTED", "STARTED", "COMPLETED", "FAILED"]

BUFFER_ENV = "ASYNCDIST_TRACE_BUFFER"
DEFAULT_CAPACITY = 2000

POSTED, STARTED, COMPLETED, FAILED = "posted", "started", "completed", "failed"
_OPEN = (POSTED, STARTED)


class Entry:
    """One recorded operation (fields as the dump names them).

    Attributes:
        serial: the rank's count of recorded operations when this one began.
        kind: "collective" (a numbered call) or "p2p" (a message; seq is its tag).
        ctx, group, seq: the engine context, the group's name and the call
            number (for point-to-point, the tag).
        desc: the description the group layer gave ("all_reduce(sum, float32[4])").
        peers: the global ranks it exchanges with (a collective's members).
        dtype, shape, nbytes: the payload, where the description does not say it.
        state: posted, started, completed or failed; times in loop seconds.
        step: the object that says what the operation waits on now
            (:class:`~asyncdist.engine.progress.Step`), while it is open.
        awaited: what it waited on when a failure froze the record.
    """

    __slots__ = (
        "serial", "kind", "ctx", "group", "seq", "desc", "peers", "dtype", "shape", "nbytes",
        "state", "posted", "started", "ended", "error", "step", "awaited",
    )  # fmt: skip

    def __init__(self) -> None:
        self.serial = -1
        self.kind = "collective"
        self.ctx = self.seq = self.nbytes = 0
        self.group = self.desc = ""
        self.peers: tuple[int, ...] = ()
        self.dtype: str | None = None
        self.shape: Any = None
        self.state = COMPLETED
        self.posted = 0.0
        self.started: float | None = None
        self.ended: float | None = None
        self.error: str | None = None
        self.step: Any = None
        self.awaited: Any = None

    def to_dict(self) -> dict[str, Any]:
        """The entry as a JSON-able dict (dump time)."""
        return {
            "serial": self.serial, "kind": self.kind, "group": self.group, "ctx": self.ctx, "seq": self.seq, "desc": self.desc,
            "peers": list(self.peers), "dtype": self.dtype, "shape": None if self.shape is None else list(self.shape),
            "nbytes": self.nbytes, "state": self.state, "posted": self.posted, "started": self.started,
            "ended": self.ended, "error": self.error, "awaited": self.awaited,
        }  # fmt: skip


def capacity_from_env(environ: Any = os.environ) -> int:
    """``ASYNCDIST_TRACE_BUFFER`` (operations kept; 0: the recorder is off), default 2000.

    Raises:
        InvalidArgumentError: it is not a whole number >= 0.
    """
    text = environ.get(BUFFER_ENV, "").strip()
    if not text:
        return DEFAULT_CAPACITY
    if not text.isdigit():
        raise InvalidArgumentError(f"{BUFFER_ENV} must be a whole number of operations >= 0, got {text!r}")
    return int(text)


class Recorder:
    """A ring of this rank's last ``capacity`` operations.

    Args:
        rank: this rank (global).
        capacity: operations kept; 0 records nothing (:meth:`open` returns None).
    """

    __slots__ = ("rank", "capacity", "_ring", "_count", "clock", "lost", "ops")

    def __init__(self, rank: int, capacity: int, ops: dict[tuple[int, str], list] | None = None) -> None:
        self.rank = rank
        #: (context, description) -> [count, seconds] of the operations that ended
        #: (:class:`~asyncdist.engine.counters.Counters`' ``ops``)
        self.ops = {} if ops is None else ops
        self.capacity = capacity
        self._ring = [Entry() for _ in range(capacity)]
        self._count = 0  # operations recorded so far
        #: the clock of every time in the record (the loop's: time.monotonic)
        self.clock = time.monotonic
        #: peers lost, global rank -> why (as the engine learned it)
        self.lost: dict[int, str] = {}

    def open(
        self, kind: str, ctx: int, group: str, seq: int, desc: str, peers: tuple[int, ...], step: Any,
        posted: float | None = None, started: float | None = None, dtype: str | None = None, shape: Any = None, nbytes: int = -1,
    ) -> Entry | None:  # fmt: skip
        """Record an operation that begins; None when the recorder is off (loop thread).

        Args:
            posted, started: loop times (``posted`` None: now; ``started``
                None: not started yet).
        """
        capacity = self.capacity
        if not capacity:
            return None
        index = self._count % capacity
        entry = self._ring[index]
        if entry.state is POSTED or entry.state is STARTED:  # its owner still runs: leave it that record
            entry = self._ring[index] = Entry()
        entry.serial = self._count
        self._count += 1
        entry.kind, entry.ctx, entry.group, entry.seq, entry.desc, entry.peers, entry.step = kind, ctx, group, seq, desc, peers, step
        entry.dtype, entry.shape, entry.nbytes = dtype, shape, nbytes
        entry.posted, entry.started, entry.ended = self.clock() if posted is None else posted, started, None
        entry.state = POSTED if started is None else STARTED
        entry.error = entry.awaited = None
        return entry

    def start(self, entry: Entry) -> None:
        """Mark ``entry`` started: its messages flow (loop thread)."""
        entry.started = self.clock()
        entry.state = STARTED

    def close(self, entry: Entry, error: BaseException | None = None) -> None:
        """Mark ``entry`` completed, or failed with ``error``, and count it (loop thread)."""
        entry.ended = ended = self.clock()
        entry.step = None
        key = (entry.ctx, entry.desc)
        stat = self.ops.get(key)
        if stat is None:
            stat = self.ops[key] = [0, 0.0]
        stat[0] += 1
        stat[1] += ended - entry.posted
        if error is None:
            entry.state = COMPLETED
        else:
            entry.state = FAILED
            entry.error = f"{type(error).__name__}: {error}"

    def freeze(self) -> None:
        """A failure happens now: note what each open operation waits on, before
        the failure withdraws it (failure path only)."""
        for entry in self.entries():
            step = entry.step
            if step is not None and entry.state in _OPEN:
                awaited = step.awaited()
                members = awaited.members
                glob = (lambda r: members[r]) if members else (lambda r: r)
                entry.awaited = {
                    "receiving": [glob(r) for r in awaited.receiving],
                    "sending": [glob(r) for r in awaited.sending],
                }

    def has_open(self) -> bool:
        """Whether an operation kept in the ring has not ended (off the hot path)."""
        return any(entry.state in _OPEN for entry in self.entries())

    def entries(self) -> list[Entry]:
        """The recorded operations, oldest first (any thread: a snapshot)."""
        count, ring = self._count, list(self._ring)
        if count <= len(ring):
            return ring[:count]
        start = count % len(ring)
        return ring[start:] + ring[:start]

    @property
    def recorded(self) -> int:
        """How many operations were recorded in all (the ring keeps the last ``capacity``)."""
        return self._count

    def where(self, ctx: int) -> dict[str, Any] | None:
        """This rank's latest operation of context ``ctx`` (or, if none is kept,
        its latest of any), as a hang query's answer; None if nothing is recorded."""
        entries = self.entries()
        chosen = next((e for e in reversed(entries) if e.ctx == ctx), None) or (entries[-1] if entries else None)
        if chosen is None:
            return None
        now = self.clock()
        answer = {k: v for k, v in chosen.to_dict().items() if k in ("kind", "group", "ctx", "seq", "desc", "state")}
        answer["for"] = round(now - (chosen.ended if chosen.ended is not None else chosen.posted), 3)
        return answer

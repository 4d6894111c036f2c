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

Cost: this runs for every operation, and inside a real call every Python
statement costs several times what it does in a tight loop, so each state
change is one step: a record is a plain list (an :data:`Entry`) made by one
list display and stored in a preallocated ring slot; its fields are read by
the index constants below (``entry[ENDED_AT]``). A start stores its time and
nothing else; an end stores its time and counts the operation (``ops``, for
``stats()``) into its description's counter, which the record holds since it
was opened (:data:`STAT`): found by one string comparison with the last
operation's description, a dictionary lookup only when the call changes.
The state is derived from the times and the error (:func:`state_of`). A
record of the same call as the last one holds the last one's description
string, so the ring holds one string, not one per record (each would be freed,
out of cache, when the ring overwrites its record). No formatting, no parsing,
no batch work, two clock reads per call (posted is the loop time the call's
deadline is computed from). The figure is in docs/benchmarks.md ("Flight
recorder cost").

Loop thread only, except :meth:`Recorder.entries`, which takes a snapshot.
"""

from __future__ import annotations

import os
import time
from typing import Any, List

from ..errors import InvalidArgumentError

__all__ = [
    "CLOCK", "Entry", "Recorder", "BUFFER_ENV", "FIELDS", "POSTED", "STARTED", "COMPLETED", "FAILED", "as_dict",
    "state_of",
]

BUFFER_ENV = "ASYNCDIST_TRACE_BUFFER"
#: The clock of every time in the record: the loop's (``loop.time()`` is ``time.monotonic()``).
CLOCK = time.monotonic
DEFAULT_CAPACITY = 2000

POSTED, STARTED, COMPLETED, FAILED = "posted", "started", "completed", "failed"
#: One recorded operation: a list whose fields are at these indices.
Entry = List[Any]
#: The fields of an :data:`Entry`, in order, as a dump names them:
#: serial (the rank's count of operations when it began); kind ("collective",
#: or "p2p": a message, whose seq is 0); ctx, group, seq (engine context, the
#: group's name, the call number); desc (the group layer's description);
#: peers (global ranks); step (what says whom it waits on, while open);
#: dtype, shape, nbytes (where the description does not say them); posted,
#: started, ended (loop times, None until then); error; awaited (frozen by a
#: failure). A dump adds the state (:func:`state_of`).
FIELDS = ("serial", "kind", "ctx", "group", "seq", "desc", "peers", "step", "dtype", "shape", "nbytes",
          "posted", "started", "ended", "error", "awaited")
(SERIAL, KIND, CTX, GROUP, SEQ, DESC, PEERS, STEP, DTYPE, SHAPE, NBYTES,
 POSTED_AT, STARTED_AT, ENDED_AT, ERROR, AWAITED) = range(len(FIELDS))  # fmt: skip
#: Past the dumped fields, an entry holds its description's counter in ``ops``
#: ([count, seconds]), which counts the operation as it ends.
STAT = len(FIELDS)


def state_of(entry: Entry) -> str:
    """An entry's state, from its times and error: posted, started, completed or failed."""
    if entry[ERROR] is not None:
        return FAILED
    if entry[ENDED_AT] is not None:
        return COMPLETED
    return POSTED if entry[STARTED_AT] is None else STARTED


def as_dict(entry: Entry) -> dict[str, Any]:
    """An entry as a JSON-able dict (dump time; the step, a live object, is left out)."""
    record = dict(zip(FIELDS, entry))
    del record["step"]
    record["state"] = state_of(entry)
    record["peers"] = list(record["peers"])
    if record["shape"] is not None:
        record["shape"] = list(record["shape"])
    return record


def _awaited(step: Any) -> tuple[list[int], list[int]]:
    """The global ranks a step waits on now: (receiving from, sending to)."""
    awaited = step.awaited()
    members = awaited.members
    return ([members[r] if members else r for r in awaited.receiving],
            [members[r] if members else r for r in awaited.sending])


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
        ops: where ended operations are counted (:class:`~asyncdist.engine.counters.Counters`' ``ops``).
    """

    __slots__ = ("rank", "capacity", "_ring", "_count", "_ctx", "_desc", "_stat", "clock", "lost", "heard", "ops")

    def __init__(self, rank: int, capacity: int, ops: dict[int, dict[str, list]] | None = None) -> None:
        self.rank = rank
        self.capacity = capacity
        self._ring: list[Entry | None] = [None] * capacity
        self._count = 0  # operations recorded so far
        #: the clock of every time in the record (the loop's: time.monotonic)
        self.clock = CLOCK
        #: peers lost, global rank -> why (as the engine learned it)
        self.lost: dict[int, str] = {}
        #: what each peer last answered a hang question (global rank -> its answer, with "asked" in loop time)
        self.heard: dict[int, dict[str, Any]] = {}
        #: context -> description -> [count, seconds] of the operations that ended
        self.ops = {} if ops is None else ops
        # the counter of the last operation's context and description: the next is most often the same call
        self._ctx, self._desc, self._stat = -1, "", [0, 0.0]

    def open(
        self, kind: str, ctx: int, group: str, seq: int, desc: str, peers: tuple[int, ...], step: Any,
        posted: float, started: float | None = None, nbytes: int = -1,
    ) -> Entry | None:  # fmt: skip
        """Record an operation that begins; None when the recorder is off (loop thread).

        Args:
            posted, started: loop times (``started`` None: not started yet).
        """
        capacity = self.capacity
        if not capacity:
            return None
        count = self._count
        self._count = count + 1
        if desc != self._desc or ctx != self._ctx:  # not the same call as the last one
            self._stat = self._stat_of(ctx, desc)
        # The last one's equal description: the ring then holds one string, not one per record to free when overwritten
        entry = [count, kind, ctx, group, seq, self._desc, peers, step, None, None, nbytes,
                 posted, started, None, None, None, self._stat]  # fmt: skip
        self._ring[count % capacity] = entry
        return entry

    def _stat_of(self, ctx: int, desc: str) -> list:
        """The ``ops`` counter of ``desc`` in context ``ctx`` (made at its first
        operation): where the operation is counted as it ends."""
        self._ctx, self._desc = ctx, desc
        return self.ops.setdefault(ctx, {}).setdefault(desc, [0, 0.0])

    @staticmethod
    def close(entry: Entry, error: BaseException | None = None) -> None:
        """Mark ``entry`` completed, or failed with ``error`` (loop thread; a
        collective's channel ends a completed call's entry itself, the same way:
        the end time, and the step let go)."""
        entry[ENDED_AT] = ended = CLOCK()
        entry[STEP] = None
        stat = entry[STAT]
        stat[0] += 1
        stat[1] += ended - entry[POSTED_AT]
        if error is not None:
            entry[ERROR] = f"{type(error).__name__}: {error}"

    def freeze(self) -> None:
        """A failure happens now: note what each open operation waits on, before
        the failure withdraws it (failure path only)."""
        for entry in self._open_entries():
            receiving, sending = _awaited(entry[STEP])
            entry[AWAITED] = {"receiving": receiving, "sending": sending}

    def awaits(self, rank: int) -> bool:
        """Whether an open operation waits on global rank ``rank`` now (off the hot path):
        a peer that leaves in order while nothing here waits on it is no failure."""
        return any(rank in receiving or rank in sending
                   for receiving, sending in (_awaited(entry[STEP]) for entry in self._open_entries()))

    def _open_entries(self) -> list[Entry]:
        return [entry for entry in self.entries() if entry[STEP] is not None and entry[ENDED_AT] is None]

    def entries(self) -> list[Entry]:
        """The recorded operations, oldest first (any thread: a snapshot)."""
        count, ring = self._count, list(self._ring)
        if count > len(ring):
            start = count % len(ring)
            ring = ring[start:] + ring[:start]
        return [entry for entry in ring if entry is not None]

    @property
    def recorded(self) -> int:
        """How many operations were recorded in all (the ring keeps the last ``capacity``)."""
        return self._count

    def where(self, ctx: int | None) -> dict[str, Any] | None:
        """This rank's latest operation of context ``ctx`` (or, if none is kept or
        ``ctx`` is None, its latest of any), as a hang query's answer; None if
        nothing is recorded."""
        entries = self.entries()
        chosen = next((e for e in reversed(entries) if e[CTX] == ctx), None) or (entries[-1] if entries else None)
        if chosen is None:
            return None
        since = chosen[ENDED_AT] if chosen[ENDED_AT] is not None else chosen[POSTED_AT]
        answer = {k: v for k, v in as_dict(chosen).items() if k in ("kind", "group", "ctx", "seq", "desc", "state")}
        answer["for"] = round(self.clock() - since, 3)
        return answer

"""The flight recorder: each rank's last operations, kept cheaply, always on.

When a job hangs or the ranks disagree, the question is what each rank was
doing. The recorder keeps the answer: a ring of the rank's last ``N``
operations (``ASYNCDIST_TRACE_BUFFER``, default 2000; 0 turns it off), each
with its group and call number, the call's
:class:`~asyncdist.flight.descriptions.Description` as the group layer made
it, the peers, the time of each state
change (posted, started, completed or failed) and the error. A dump
(:mod:`asyncdist.flight.dumps`) writes it as JSON; ``asyncdist-trace``
merges the dumps of every rank.

It must not know the names of collectives: the group layer hands it a
description and the engine stores it. A dump writes the description's text
(``desc``) and its parts (``described``), which ``asyncdist-trace`` reads;
nothing is parsed back.

The ring the operations are recorded in, on the hot path, is
:mod:`asyncdist.flight.record_ring` (in C where it was built); this module is what
reads it and what the failure paths add: the state of each record, the
peers lost, the hang questions' answers, what open operations waited on as
a failure happened. No formatting, no parsing, no batch work on the hot
path; ``python -m asyncdist.bench.recorder`` measures the cost.

Loop thread only, except :meth:`Recorder.entries`, which takes a snapshot.
"""

from __future__ import annotations

from typing import Any, Mapping

from .. import settings
from .record_ring import (
    CLOCK, CTX, ENDED_AT, ERROR, FIELDS, POSTED_AT, SERIAL, STARTED_AT, STEP, Entry, RecordRing,
)  # fmt: skip

__all__ = [
    "CLOCK", "Entry", "Recorder", "BUFFER_ENV", "FIELDS", "POSTED", "STARTED", "COMPLETED", "FAILED", "as_dict",
    "state_of",
]

BUFFER_ENV = settings.name_of("trace_buffer")

POSTED, STARTED, COMPLETED, FAILED = "posted", "started", "completed", "failed"


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
    described = record["desc"]
    record["desc"], record["described"] = described.text, described.as_dict()
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


def capacity_from_env(environ: Mapping[str, str] | None = None) -> int:
    """``ASYNCDIST_TRACE_BUFFER`` (operations kept; 0: the recorder is off), default 2000,
    as the settings say (or ``environ``).

    Raises:
        ConfigurationError: it is not a whole number >= 0.
    """
    return (settings.current() if environ is None else settings.Settings.from_environ(environ)).trace_buffer


class Recorder:
    """A rank's flight recorder: a ring of its last ``capacity`` operations, and what failures add.

    Args:
        rank: this rank (global).
        capacity: operations kept; 0 records nothing (the ring's ``open`` returns None).
        ops: where ended operations are counted (:class:`~asyncdist.flight.counters.Counters`' ``ops``).
        ring: the ring's type (:data:`~asyncdist.flight.record_ring.RecordRing`: the C one where it was built).

    Attributes:
        ring: where operations are recorded: the hot path calls its ``open``,
            ``start`` and ``end`` itself (:mod:`asyncdist.flight.record_ring`).
    """

    __slots__ = ("rank", "ring", "clock", "lost", "heard", "ops")

    def __init__(
        self, rank: int, capacity: int, ops: dict[int, dict[Any, list]] | None = None, ring: type = RecordRing
    ) -> None:
        self.rank = rank
        #: context -> description -> [count, seconds] of the operations that ended
        self.ops = {} if ops is None else ops
        self.ring = ring(capacity, self.ops)
        #: the clock of every time in the record (the loop's: time.monotonic)
        self.clock = CLOCK
        #: peers lost, global rank -> why (as the engine learned it)
        self.lost: dict[int, str] = {}
        #: what each peer last answered a hang question (global rank -> its answer, with "asked" in loop time)
        self.heard: dict[int, dict[str, Any]] = {}

    @property
    def capacity(self) -> int:
        """Operations kept (0: the recorder is off)."""
        return int(self.ring.capacity)

    def close(self, handle: Any, error: BaseException | None = None) -> bool:
        """End the operation of ``handle`` (what the ring's ``open`` returned),
        completed or failed with ``error``; False if it had ended (the hot path
        calls the ring's ``end`` itself)."""
        return bool(self.ring.end(handle, None if error is None else f"{type(error).__name__}: {error}"))

    def freeze(self) -> None:
        """A failure happens now: note what each open operation waits on, before
        the failure withdraws it (failure path only)."""
        for entry in self._open_entries():
            receiving, sending = _awaited(entry[STEP])
            self.ring.note_awaited(entry[SERIAL], {"receiving": receiving, "sending": sending})

    def awaits(self, rank: int) -> bool:
        """Whether an open operation waits on global rank ``rank`` now (off the hot path):
        a peer that leaves in order while nothing here waits on it is no failure."""
        return any(rank in receiving or rank in sending
                   for receiving, sending in (_awaited(entry[STEP]) for entry in self._open_entries()))

    def _open_entries(self) -> list[Entry]:
        return [entry for entry in self.entries() if entry[STEP] is not None and entry[ENDED_AT] is None]

    def entries(self) -> list[Entry]:
        """The recorded operations, oldest first (any thread: a snapshot)."""
        return self.ring.entries()

    @property
    def recorded(self) -> int:
        """How many operations were recorded in all (the ring keeps the last ``capacity``)."""
        return int(self.ring.recorded)

    def where(self, ctx: int | None) -> dict[str, Any] | None:
        """This rank's latest operation of context ``ctx`` (or, if none is kept or
        ``ctx`` is None, its latest of any), as a hang query's answer; None if
        nothing is recorded."""
        entries = self.entries()
        chosen = next((e for e in reversed(entries) if e[CTX] == ctx), None) or (entries[-1] if entries else None)
        if chosen is None:
            return None
        since = chosen[ENDED_AT] if chosen[ENDED_AT] is not None else chosen[POSTED_AT]
        answer = {k: v for k, v in as_dict(chosen).items() if k in ("kind", "group", "ctx", "seq", "desc", "described", "state")}
        answer["for"] = round(self.clock() - since, 3)
        return answer

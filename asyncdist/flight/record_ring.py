"""The flight recorder's ring: where every operation is recorded, in C or in Python.

This is the recorder's hot path, separate from what reads it
(:mod:`asyncdist.flight.recorder`): each operation calls :meth:`RecordRing.open`
as it is posted, :meth:`RecordRing.start` as its messages begin to flow and
:meth:`RecordRing.end` as it completes or fails, with the handle ``open`` returned.
``end`` also counts the operation into its description's counter in ``ops``
(``[count, seconds]``, for ``stats()``). The ring keeps the last
``capacity`` records and knows no names of collectives.

:data:`RecordRing` is the C ring (``asyncdist/flight/_record_ring.c``) where it was built
at install (a C compiler, and Linux or Python 3.13+, whose clock API it
reads), else :class:`PyRecordRing`, this module's Python one. They pass the
same tests and differ in cost: 0.5-0.9 us of CPU per 8-byte all_reduce
and rank in C, 2-2.7 us in Python (``python -m asyncdist.bench.recorder``
measures it). A record in Python is a list the ring keeps, and freeing it 2000
operations later, out of cache, costs as much as the rest of the work; in
C it is a struct in a preallocated array.

Handles are opaque: an int in C, the record itself in Python. Loop thread
only, except ``entries()``, a snapshot (copies) from any thread.
"""

from __future__ import annotations

import time
from typing import Any, List, Optional

__all__ = ["CLOCK", "Entry", "FIELDS", "NATIVE", "PyRecordRing", "RecordRing"]

#: The clock of every time in the record: the loop's (``loop.time()`` is ``time.monotonic()``).
CLOCK = time.monotonic
#: One recorded operation as :meth:`RecordRing.entries` gives it: a list whose fields are at these indices.
Entry = List[Any]
#: The fields of an :data:`Entry`, in order, as a dump names them:
#: serial (the rank's count of operations when it began); kind ("collective",
#: or "p2p": a message, whose seq is 0); ctx, group, seq (engine context, the
#: group's name, the call number); desc (the group layer's description);
#: peers (global ranks); step (what says whom it waits on, while open);
#: dtype, shape (None: the description says them); nbytes; posted,
#: started, ended (loop times, None until then); error; awaited (frozen by a
#: failure). A dump adds the state.
FIELDS = ("serial", "kind", "ctx", "group", "seq", "desc", "peers", "step", "dtype", "shape", "nbytes",
          "posted", "started", "ended", "error", "awaited")
(SERIAL, KIND, CTX, GROUP, SEQ, DESC, PEERS, STEP, DTYPE, SHAPE, NBYTES,
 POSTED_AT, STARTED_AT, ENDED_AT, ERROR, AWAITED) = range(len(FIELDS))  # fmt: skip
#: Past the fields, a Python record holds its description's counter (``[count, seconds]``).
_STAT = len(FIELDS)


class PyRecordRing:
    """The last ``capacity`` operations, counted into ``ops`` as they end.

    Args:
        capacity: records kept; 0 records nothing (:meth:`open` returns None).
        ops: context -> description -> ``[count, seconds]``, filled as operations end.
    """

    __slots__ = ("capacity", "_ops", "_ring", "_count", "_ctx", "_desc", "_stat")

    def __init__(self, capacity: int, ops: dict[int, dict[Any, list]]) -> None:
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        self.capacity = capacity
        self._ops = ops
        self._ring: list[Entry | None] = [None] * capacity
        self._count = 0
        # the last operation's context, description and counter: the next is most often the same call
        self._ctx, self._desc, self._stat = -1, None, [0, 0.0]

    def open(
        self, kind: str, ctx: int, group: str, seq: int, desc: Any, peers: tuple[int, ...], step: Any,
        posted: float, started: float | None = None, nbytes: int = -1, /,
    ) -> Optional[Entry]:  # fmt: skip
        """Record an operation that begins (loop times); its handle, or None when the capacity is 0."""
        capacity = self.capacity
        if not capacity:
            return None
        count = self._count
        self._count = count + 1
        if ctx != self._ctx or (desc is not self._desc and desc != self._desc):  # not the same call as the last one
            self._ctx, self._desc = ctx, desc
            self._stat = self._ops.setdefault(ctx, {}).setdefault(desc, [0, 0.0])
        # The last one's equal description: the ring then holds one, not one per record to free when overwritten
        entry = [count, kind, ctx, group, seq, self._desc, peers, step, None, None, nbytes,
                 posted, started, None, None, None, self._stat]  # fmt: skip
        self._ring[count % capacity] = entry
        return entry

    @staticmethod
    def start(handle: Entry, /) -> None:
        """The operation's messages flow from now."""
        handle[STARTED_AT] = CLOCK()

    @staticmethod
    def end(handle: Entry, error: str | None = None, /) -> bool:
        """End the operation now, completed or failed with ``error``; False if it had ended."""
        if handle[ENDED_AT] is not None:
            return False
        handle[ENDED_AT] = ended = CLOCK()
        handle[STEP] = None
        stat = handle[_STAT]
        stat[0] += 1
        stat[1] += ended - handle[POSTED_AT]
        if error is not None:
            handle[ERROR] = error
        return True

    def entries(self) -> list[Entry]:
        """The records kept, oldest first (copies)."""
        count, ring = self._count, list(self._ring)
        if count > len(ring):
            start = count % len(ring)
            ring = ring[start:] + ring[:start]
        return [entry[:_STAT] for entry in ring if entry is not None]

    def note_awaited(self, serial: int, awaited: Any, /) -> None:
        """What the open operation ``serial`` waits on as a failure happens (kept in its record)."""
        entry = self._ring[serial % self.capacity] if self.capacity else None
        if entry is not None and entry[SERIAL] == serial:
            entry[AWAITED] = awaited

    @property
    def recorded(self) -> int:
        """Operations recorded in all (the ring keeps the last ``capacity``)."""
        return self._count


try:
    from ._record_ring import RecordRing as _NativeRing
except ImportError:  # not built at install (no compiler): the Python ring serves
    RecordRing: type = PyRecordRing
    NATIVE = False
else:
    RecordRing = _NativeRing
    NATIVE = True

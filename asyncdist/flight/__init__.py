"""The flight recorder: what every rank did last, seen from outside.

Each operation is recorded as it is posted, starts and ends
(:mod:`~asyncdist.flight.record_ring`, in C where it was built, read by
:mod:`~asyncdist.flight.recorder`); :mod:`~asyncdist.flight.dumps` writes
the record on failure, SIGUSR1, demand or a peer's question, with every
thread's stack from :mod:`~asyncdist.flight.stacks`;
:mod:`~asyncdist.flight.whereabouts` asks peers where they are when a call
waits too long;
:mod:`~asyncdist.flight.counters` counts bytes and messages per peer;
:mod:`~asyncdist.flight.descriptions` reads a record's description for
people. :class:`~asyncdist.flight.instruments.Flight` holds them all, one
per engine. This layer sits under the engine: it records, it never decides
what an operation does.
"""

from .instruments import Flight

__all__ = ["Flight"]

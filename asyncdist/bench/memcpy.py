"""The machine's copy bandwidth, and the least time a large row's copies could take at it.

Between ranks of one host, every byte a call delivers to a rank lands in
that rank's memory by at least one copy (a read and a write), whatever
carries it: a socket (two kernel copies), a shared-memory ring or a read
across processes (one). So a large row cannot take less than the time the
host's cores need to copy those bytes. :func:`copy_gbps` measures what one
core copies: a NumPy copy of :data:`MEASURE_BYTES` between two buffers
already touched, best of :data:`REPS` (the best, not the median: the bound
must be the machine's, not the noise's).

The model (:data:`MODEL`): which ranks receive data in one call, and how
many bytes each must receive, for a row of ``size`` bytes (the largest
buffer a rank holds) on ``n`` ranks, by the optimal algorithms:

* all_reduce: every rank, 2(n-1)/n x size (a reduce-scatter, then an
  all-gather, each receiving (n-1)/n of the buffer);
* broadcast: the n-1 ranks but the root, size each;
* all_gather, reduce_scatter, all_to_all: every rank, (n-1)/n x size (the
  other ranks' parts);
* sendrecv: one rank, size (the time is one way).

The bytes per receiving rank are nccl-tests' busbw factors, so busbw / copy
bandwidth is the fraction of the hardware a row reached. The receivers'
copies share the cores: :func:`least_us` spreads them over
``min(receivers, cores)`` cores, each copying at the measured bandwidth,

    least time = receivers x bytes each / (min(receivers, cores) x copy bandwidth).

It is a lower bound, and an optimistic one: two cores copy less than twice
what one does (they share the memory bus), and a reduction also reads the
rank's own buffer.
"""

from __future__ import annotations

from dataclasses import dataclass
from time import perf_counter
from typing import Callable

__all__ = ["MEASURE_BYTES", "REPS", "BOUND_MIN_BYTES", "Share", "MODEL", "copy_gbps", "bytes_per_rank", "least_us"]

#: Bytes copied per measurement: well past any cache.
MEASURE_BYTES = 64 << 20
REPS = 7
#: Rows this large and more are compared with the bound; below it, fixed costs per message dominate.
BOUND_MIN_BYTES = 16 << 20



@dataclass(frozen=True, slots=True)
class Share:
    """What one call of an op must copy: ``receivers(n)`` ranks receive ``each(size, n)`` bytes each."""

    formula: str  # as the page prints it
    receivers: Callable[[int], int]
    each: Callable[[int, int], float]


def _part(size: int, n: int) -> float:
    return (n - 1) / n * size


#: Per op, its :class:`Share` (barrier moves no data: not modelled).
MODEL: dict[str, Share] = {
    "all_reduce": Share("2(n-1)/n x size, on each of n ranks", lambda n: n, lambda size, n: 2 * _part(size, n)),
    "broadcast": Share("size, on each of n-1 ranks", lambda n: n - 1, lambda size, n: float(size)),
    "all_gather": Share("(n-1)/n x size, on each of n ranks", lambda n: n, _part),
    "reduce_scatter": Share("(n-1)/n x size, on each of n ranks", lambda n: n, _part),
    "all_to_all": Share("(n-1)/n x size, on each of n ranks", lambda n: n, _part),
    "sendrecv": Share("size, on one rank (one way)", lambda n: 1, lambda size, n: float(size)),
}


def copy_gbps(nbytes: int = MEASURE_BYTES, reps: int = REPS) -> float:
    """One core's copy bandwidth, GB/s (1e9 bytes copied per second; blocks ~0.1 s).

    Args:
        nbytes: bytes per copy.
        reps: copies timed after one untimed; the fastest is reported.
    """
    import numpy as np

    source = np.ones(nbytes, np.uint8)
    dest = np.empty_like(source)
    np.copyto(dest, source)  # the first copy faults the destination's pages in
    best = float("inf")
    for _ in range(reps):
        start = perf_counter()
        np.copyto(dest, source)
        best = min(best, perf_counter() - start)
    return nbytes / best / 1e9


def bytes_per_rank(op: str, nbytes: int, n: int) -> float | None:
    """The bytes each receiving rank must receive per call of ``op`` on a row of
    ``nbytes`` (None: ``op`` is not modelled, e.g. barrier)."""
    model = MODEL.get(op)
    return None if model is None else model.each(nbytes, n)


def least_us(op: str, nbytes: int, n: int, gbps: float, cores: int) -> float | None:
    """The least time of one call, microseconds, at ``gbps`` per core (None: ``op`` not modelled).

    Args:
        op, nbytes, n: the row: op, size in bytes, ranks.
        gbps: one core's copy bandwidth (:func:`copy_gbps`).
        cores: the host's cores; the receivers' copies run on at most ``min(receivers, cores)`` at once.
    """
    model = MODEL.get(op)
    if model is None:
        return None
    receivers = model.receivers(n)
    return receivers * model.each(nbytes, n) / (min(receivers, cores) * gbps * 1e9) * 1e6

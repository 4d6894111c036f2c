"""Start each series' rank processes and turn their timings into rows.

Every series runs in a fresh set of ``plan.world_size`` processes started
by :func:`asyncdist.testing.spawn` (a parent-served store on an ephemeral
port), one series after the other, so two libraries never share a process
or compete for the cores. gloo ranks rendezvous through ``file://`` on a
temporary file instead; they ignore the asyncdist store.

The timings come back as ``spawn``'s results (a multiprocessing queue), and
:func:`combine` reduces them: per repetition the slowest rank's time, then
the median over repetitions.
"""

from __future__ import annotations

import os
import statistics
import tempfile
from dataclasses import dataclass

from ..testing.spawn import spawn
from .cases import CASES
from .loops import Sample, await_rank, facade_rank, gloo_rank
from .plan import DTYPE_SIZES, Plan, Series

__all__ = ["Row", "run_series", "combine"]


@dataclass(frozen=True, slots=True)
class Row:
    """One (op, size, series) result.

    Attributes:
        nbytes, count: the row's size in bytes and elements (0 when unsized).
        time_us: median over repetitions of the slowest rank's time per call
            (per one-way leg for a ping-pong), microseconds.
        algbw, busbw: GB/s (1e9 bytes), None for rows without bandwidth.
        reps_us: the slowest rank's time of each repetition.
        iters: calls per repetition.
    """

    op: str
    nbytes: int
    count: int
    dtype: str
    series: Series
    world_size: int
    time_us: float
    algbw: float | None
    busbw: float | None
    iters: int
    reps_us: tuple[float, ...]


def run_series(series: Series, plan: Plan, *, timeout: float, env: dict[str, str] | None = None) -> list[Row]:
    """Measure ``plan`` on ``series`` in its own rank processes (blocks).

    Args:
        timeout: seconds the whole sweep of this series may take.
        env: extra environment for the ranks (e.g. ``ASYNCDIST_LOOP``).

    Raises:
        Exception: a rank's error, re-raised by ``spawn`` with its traceback.
        DistTimeoutError: the sweep took longer than ``timeout``.
    """
    if series.library == "gloo":
        with tempfile.TemporaryDirectory(prefix="asyncdist-bench-") as tmp:
            init_file = os.path.join(tmp, "rendezvous")
            per_rank = spawn(plan.world_size, gloo_rank, plan, init_file, timeout=timeout, env=env)
    else:
        body = facade_rank if series.api == "facade" else await_rank
        per_rank = spawn(plan.world_size, body, plan, timeout=timeout, env=env)
    return combine(series, plan, per_rank)


def combine(series: Series, plan: Plan, per_rank: list[list[Sample]]) -> list[Row]:
    """Rows from each rank's samples (``per_rank[rank][job]``): per repetition
    the max over ranks, then the median over repetitions."""
    rows = []
    for index, job in enumerate(plan.jobs):
        case = CASES[job.op]
        samples = [samples[index] for samples in per_rank]
        slowest = [max(s.seconds[rep] for s in samples) / case.legs for rep in range(plan.reps)]
        seconds = statistics.median(slowest)
        nbytes = job.count * DTYPE_SIZES[plan.dtype]
        algbw = busbw = None
        if case.bus_factor is not None and seconds > 0:
            algbw = nbytes / seconds / 1e9
            busbw = algbw * case.bus_factor(plan.world_size)
        rows.append(
            Row(
                op=job.op,
                nbytes=nbytes,
                count=job.count,
                dtype=plan.dtype,
                series=series,
                world_size=plan.world_size,
                time_us=seconds * 1e6,
                algbw=algbw,
                busbw=busbw,
                iters=samples[0].iters,
                reps_us=tuple(s * 1e6 for s in slowest),
            )
        )
    return rows

"""Start each series' rank processes and turn their timings into rows.

Every series runs in a fresh set of ``plan.world_size`` processes started
by :func:`asyncdist.testing.spawn` (a parent-served store on an ephemeral
port), one series after the other, so two libraries never share a process
or compete for the cores. torch.distributed's ranks (gloo, and asyncdist's
torch backend) rendezvous through ``file://`` on a temporary file instead;
they ignore the asyncdist store.

A series measures the jobs it can run (:func:`series_plan`): the await API
and the facade every row but those that need torch.distributed's own API
(the training steps), asyncdist's torch backend and gloo all of them, MPI
all but those (under ``mpirun``: :mod:`asyncdist.bench.mpi`).

The timings come back as ``spawn``'s results (a multiprocessing queue), and
:func:`combine` reduces them: per repetition the slowest rank's time, then
the median over repetitions.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
from dataclasses import dataclass

from ..testing.spawn import spawn
from .cases import CASES, job_dtype
from .loops import Sample, await_rank, facade_rank, torch_rank
from .mpi import run_mpi
from .plan import Plan, Series

__all__ = ["Row", "run_series", "series_plan", "runs", "combine"]


@dataclass(frozen=True, slots=True)
class Row:
    """One (op, size, series) result.

    Attributes:
        nbytes, count: the row's size in bytes and elements (0 when unsized;
            for the DDP step, the model's parameters and their bytes).
        time_us: median over repetitions of the slowest rank's time per call
            (per one-way leg for a ping-pong), microseconds.
        algbw, busbw: GB/s (1e9 bytes), None for rows without bandwidth.
        reps_us: the slowest rank's time of each repetition.
        iters: calls per repetition.
        overhead_us: for the facade's small rows of a paired plan, the median
            over repetitions of (facade time - await API time of the paired
            repetition), each the slowest rank's; else None.
        stats: rank 0's counters over the timed repetitions (``--stats``), or None.
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
    overhead_us: float | None = None
    stats: dict | None = None


def runs(series: Series, op: str) -> bool:
    """Whether ``series`` measures ``op`` (see the module doc)."""
    if series.library == "gloo" or series.api == "backend":
        return True
    return not CASES[op].torch_api


def series_plan(series: Series, plan: Plan) -> Plan:
    """``plan`` with only the jobs ``series`` measures."""
    return dataclasses.replace(plan, jobs=tuple(job for job in plan.jobs if runs(series, job.op)))


def run_series(series: Series, plan: Plan, *, timeout: float, env: dict[str, str] | None = None) -> list[Row]:
    """Measure ``plan``'s jobs that ``series`` runs, in its own rank processes (blocks).

    Args:
        timeout: seconds the whole sweep of this series may take.
        env: extra environment for the ranks (e.g. ``ASYNCDIST_LOOP``).

    Returns:
        One row per job measured; none (and no process started) if ``series`` runs none.

    Raises:
        Exception: a rank's error, re-raised by ``spawn`` with its traceback.
        DistTimeoutError: the sweep took longer than ``timeout``.
    """
    plan = series_plan(series, plan)
    if not plan.jobs:
        return []
    if series.library == "mpi":
        per_rank = run_mpi(plan, timeout=timeout)
    elif series.api in ("torch", "backend"):
        backend = "gloo" if series.library == "gloo" else "asyncdist"
        with tempfile.TemporaryDirectory(prefix="asyncdist-bench-") as tmp:
            init_file = os.path.join(tmp, "rendezvous")
            per_rank = spawn(plan.world_size, torch_rank, plan, init_file, backend, timeout=timeout, env=env)
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
        overhead = None
        if samples[0].paired:
            paired = [max(s.paired[rep] for s in samples) / case.legs for rep in range(plan.reps)]
            overhead = statistics.median(f - a for f, a in zip(slowest, paired)) * 1e6
        dtype, nbytes = job_dtype(job, plan.dtype)
        algbw = busbw = None
        if case.bus_factor is not None and seconds > 0:
            algbw = nbytes / seconds / 1e9
            busbw = algbw * case.bus_factor(plan.world_size)
        rows.append(
            Row(
                op=job.op,
                nbytes=nbytes,
                count=job.count,
                dtype=dtype,
                series=series,
                world_size=plan.world_size,
                time_us=seconds * 1e6,
                algbw=algbw,
                busbw=busbw,
                iters=samples[0].iters,
                reps_us=tuple(s * 1e6 for s in slowest),
                overhead_us=overhead,
                stats=samples[0].stats,
            )
        )
    return rows

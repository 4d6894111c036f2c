"""The timing loops, run inside the rank processes of one series.

For each job of the plan, every rank:

1. makes the job's buffers and calls (:mod:`asyncdist.bench.cases`);
2. makes ``plan.warmup`` untimed-for-the-report calls, timing each alone;
3. agrees with the other ranks on the calls per repetition: an
   all_reduce(MAX) of its median warm-up time, so the slowest rank's
   estimate decides and every rank makes the same number of calls;
4. runs ``plan.reps`` repetitions, each after a barrier, each timing
   ``iters`` back-to-back calls with ``perf_counter`` (one call for a
   ``one_per_rep`` case: a DDP training step is timed step by step).

A rank returns its own seconds per call for each repetition; the parent
takes the max over ranks and the median over repetitions
(:mod:`asyncdist.bench.runner`). The library under test carries the
agreement and the barriers, outside the timed region, never the timings.
The garbage collector is off while a repetition runs (as ``timeit`` does),
in every series alike.

Three rank bodies: :func:`await_rank` (asyncdist's await API, on an event
loop in the rank's main thread), :func:`facade_rank` (the blocking facade)
and :func:`torch_rank` (torch.distributed itself, on gloo or on asyncdist's
torch backend). The last two share one loop because the facade has
torch.distributed's names; the first has the same loop with ``await`` (the
colour rule: a plain loop never awaits).
"""

from __future__ import annotations

import contextlib
import gc
import statistics
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Any, Callable, Iterator

from .. import settings
from .cases import CASES, Calls, Point, job_dtype, zeros
from .plan import OVERHEAD_MAX_BYTES, Job, Plan
from .progress import Progress

__all__ = ["Sample", "await_rank", "facade_rank", "torch_rank", "measure_blocking", "blocking_jobs"]


@dataclass(frozen=True, slots=True)
class Sample:
    """One rank's timings of one job: seconds per call (per iteration of a
    multi-call case), one per repetition; ``paired``, the await API's time of
    the repetition run right after each (facade, paired plans only);
    ``stats``, the rank's counters over the timed repetitions (``--stats``)."""

    iters: int
    seconds: tuple[float, ...]
    paired: tuple[float, ...] = ()
    stats: dict | None = None


@contextlib.contextmanager
def _gc_off() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _calls(comm: Any, plan: Plan, job: Job, rank: int) -> Calls:
    return CASES[job.op].build(comm, Point(rank, plan.world_size, job.count, plan.dtype, plan.array))


def _iters(plan: Plan, job: Job, estimate: Any) -> int:
    """Calls per repetition, the same on every rank (the slowest rank's estimate decides)."""
    return 1 if CASES[job.op].one_per_rep else plan.choose_iters(float(estimate[0]))


def _estimate(warm: list[float], plan: Plan) -> Any:
    """A one-element float64 buffer holding this rank's warm-up median, to all_reduce(MAX)."""
    buf = zeros(1, "float64", plan.array)
    buf[0] = statistics.median(warm) if warm else 0.0
    return buf


def _each(plan: Plan, rank: int) -> Iterator[Job]:
    """The plan's jobs, with the live progress line (rank 0) kept up to date."""
    progress = Progress(len(plan.jobs), plan.progress and rank == 0)
    for index, job in enumerate(plan.jobs):
        progress.job(index, job, job_dtype(job, plan.dtype)[1] if CASES[job.op].sized else 0)
        yield job
    progress.done()


# -- the blocking APIs: torch.distributed (gloo or asyncdist backend), the facade --


def _time_blocking(calls: Calls, iters: int) -> float:
    start = perf_counter()
    for _ in range(iters):
        for call in calls:
            call()
    return perf_counter() - start


def measure_blocking(dist: Any, plan: Plan, job: Job, rank: int, paired: Callable[[int], float] | None = None) -> Sample:
    """Time ``job``'s calls through ``dist``; after each repetition, ``paired(iters)``
    (if given) times the same number of calls another way."""
    calls = _calls(dist, plan, job, rank)
    estimate = _estimate([_time_blocking(calls, 1) for _ in range(plan.warmup)], plan)
    dist.all_reduce(estimate, op=dist.ReduceOp.MAX)
    iters = _iters(plan, job, estimate)
    seconds, other = [], []
    counters = getattr(dist, "get_stats", None) if plan.stats else None  # asyncdist's facade only
    if counters is not None:
        counters(reset=True)
    for _ in range(plan.reps):
        dist.barrier()
        with _gc_off():
            seconds.append(_time_blocking(calls, iters) / iters)
        if paired is not None:
            dist.barrier()
            with _gc_off():
                other.append(paired(iters) / iters)
    stats = None
    if counters is not None:
        stats = counters()
        dist.barrier()  # read before any rank sends the next job's messages
    return Sample(iters, tuple(seconds), tuple(other), stats)


def blocking_jobs(comm: Any, plan: Plan, rank: int) -> list[Sample]:
    """Measure every job of ``plan`` through ``comm``, a blocking communicator
    with torch.distributed's names (torch.distributed itself, or :class:`~asyncdist.bench.mpi.MpiComm`)."""
    return [measure_blocking(comm, plan, job, rank) for job in _each(plan, rank)]


def facade_rank(plan: Plan) -> list[Sample]:
    """Rank body: measure every job through ``import asyncdist as dist`` (env:// rendezvous).

    In a paired plan each small job's repetitions alternate with repetitions
    of the await API on the facade's own loop and world group, so that the
    facade's overhead is the difference of two timings taken moments apart
    in the same processes, not of two series run minutes apart.
    """
    import asyncdist as dist
    from ..facade.lifecycle import _portal, _world

    dist.init_process_group()
    try:
        samples = []
        for job in _each(plan, dist.get_rank()):
            paired = None
            if plan.paired and job_dtype(job, plan.dtype)[1] <= OVERHEAD_MAX_BYTES:
                awaited = _calls(_world(), plan, job, dist.get_rank())

                def paired(iters: int, awaited: Calls = awaited) -> float:
                    return _portal().run(_time_await(awaited, iters))

            samples.append(measure_blocking(dist, plan, job, dist.get_rank(), paired))
        return samples
    finally:
        dist.destroy_process_group()


def torch_rank(plan: Plan, init_file: str, backend: str) -> list[Sample]:
    """Rank body: measure every job through torch.distributed, on ``backend``.

    Args:
        init_file: a path that does not exist yet, for ``file://`` rendezvous
            (no port to choose; the backend's own sockets take ephemeral ports).
            ``spawn``'s store speaks asyncdist's protocol, which torch's env://
            cannot, so torch's own FileStore is used, for both backends alike.
        backend: ``"gloo"``, or ``"asyncdist"`` (asyncdist's torch backend,
            registered by importing :mod:`asyncdist.torch_backend`).
    """
    import torch.distributed as dist

    if backend == "asyncdist":
        import asyncdist.torch_backend  # noqa: F401  registers the backend

    rank = int(settings.current().environ["RANK"])
    dist.init_process_group(backend, init_method=Path(init_file).as_uri(), rank=rank, world_size=plan.world_size)
    try:
        return blocking_jobs(dist, plan, rank)
    finally:
        dist.destroy_process_group()


# -- the await API ---------------------------------------------------------------


async def _time_await(calls: Calls, iters: int) -> float:
    start = perf_counter()
    for _ in range(iters):
        for call in calls:
            await call()
    return perf_counter() - start


async def _measure_await(world: Any, plan: Plan, job: Job) -> Sample:
    from ..reduce.op import ReduceOp

    calls = _calls(world, plan, job, world.rank)
    estimate = _estimate([await _time_await(calls, 1) for _ in range(plan.warmup)], plan)
    await world.all_reduce(estimate, ReduceOp.MAX)
    iters = _iters(plan, job, estimate)
    seconds = []
    if plan.stats:
        world.stats(reset=True)
    for _ in range(plan.reps):
        await world.barrier()
        with _gc_off():
            seconds.append(await _time_await(calls, iters) / iters)
    stats = None
    if plan.stats:
        stats = world.stats()
        await world.barrier()  # read before any rank sends the next job's messages
    return Sample(iters, tuple(seconds), stats=stats)


async def _await_main(plan: Plan) -> list[Sample]:
    from ..group.world import init_world

    world = await init_world()
    try:
        return [await _measure_await(world, plan, job) for job in _each(plan, world.rank)]
    finally:
        await world.close()


def await_rank(plan: Plan) -> list[Sample]:
    """Rank body: measure every job through the await API, on asyncdist's
    event loop (uvloop unless ``ASYNCDIST_LOOP=asyncio``) in this thread."""
    from ..loop.choice import new_event_loop

    loop = new_event_loop()
    try:
        return loop.run_until_complete(_await_main(plan))
    finally:
        loop.close()

"""The registry of benchmark rows: what one timed call of each op does.

A :class:`Case` turns a *communicator* and a :class:`Point` into the list
of calls that make up one timed iteration. A communicator is anything with
torch.distributed's method names: the ``torch.distributed`` module (gloo),
the ``asyncdist`` module (the blocking facade) or an asyncdist
:class:`~asyncdist.group.process_group.ProcessGroup` (the await API, whose methods return
coroutines). The names and arguments agree, so one definition serves all
three; the timing loops in :mod:`asyncdist.bench.loops` call, or await, the
calls.

Sizes follow nccl-tests: a row's byte size is that of the largest buffer a
rank holds (all_gather's output, reduce_scatter's input), and ops that
split a buffer over the ranks round the element count down to a multiple
of the world size. Buffers are zeros, so repeated sums never overflow.

New rows are added with :func:`register`; a case that is not sized
(``sized=False``) is measured once, not per size. The DDP training step
(:mod:`asyncdist.bench.ddp`) is such a row, with a fixed count (the model's
parameters) and ``torch_api=True``: it needs torch.distributed itself (a
model wrapped in DistributedDataParallel), so asyncdist runs it through its
torch backend rather than the await API or the facade. ``--ops ddp`` also
measures the same model's step without DDP (``ddp_compute``) and with one
flattened all_reduce after backward (``ddp_flat``); ``fsdp`` is FSDP2's
step (:mod:`asyncdist.bench.fsdp`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from . import ddp, fsdp
from .plan import DTYPE_SIZES, Job

__all__ = ["Case", "Point", "CASES", "register", "jobs", "job_dtype", "zeros"]

Calls = list[Callable[[], Any]]


@dataclass(frozen=True, slots=True)
class Point:
    """Where a case runs: this rank, the world size, and the buffers' shape.

    ``count`` is the element count of the row's size (see the module doc);
    :meth:`buffer` makes a zeroed buffer of the run's dtype and array kind.
    """

    rank: int
    world_size: int
    count: int
    dtype: str
    array: str

    def buffer(self, count: int) -> Any:
        return zeros(count, self.dtype, self.array)


@dataclass(frozen=True, slots=True)
class Case:
    """One benchmark row.

    Attributes:
        name: the op's name (``--ops`` and the json's ``op``).
        build: ``build(comm, point)`` -> the calls of one iteration.
        bus_factor: ``bus_factor(n)`` turns algbw into busbw; None: the
            row has no bandwidth (barrier).
        sized: measured per size (else once, with ``count`` 0).
        split: the element count must divide by the world size.
        legs: the iteration's time is divided by this (a ping-pong's round
            trip is 2 one-way legs).
        note: how busbw (or the time) is derived, for the table heading.
        torch_api: needs torch.distributed's own API (``comm`` is the
            ``torch.distributed`` module): measured on gloo, and on asyncdist
            through its torch backend, never through the await API or facade.
        dtype: the element type of the row whatever ``--dtype`` says (None: ``--dtype``).
        one_per_rep: every repetition is a single call, whatever ``--iters``
            says, so the report is the median over calls (training steps).
    """

    name: str
    build: Callable[[Any, Point], Calls]
    bus_factor: Callable[[int], float] | None
    sized: bool = True
    split: bool = False
    legs: int = 1
    note: str = ""
    torch_api: bool = False
    dtype: str | None = None
    one_per_rep: bool = False

    def count_for(self, nbytes: int, itemsize: int, n: int) -> int:
        """Element count of a row of ``nbytes`` bytes (at least one per rank)."""
        if not self.sized:
            return 0
        count = max(1, nbytes // itemsize)
        if self.split:
            count = max(1, count // n) * n
        return count


CASES: dict[str, Case] = {}


def register(case: Case) -> Case:
    """Add ``case`` to :data:`CASES` (its name must be new)."""
    if case.name in CASES:
        raise ValueError(f"benchmark case {case.name!r} is already registered")
    CASES[case.name] = case
    return case


def jobs(ops: list[str], sizes: list[int], itemsize: int, world_size: int,
         fixed: dict[str, int] | None = None) -> tuple[Job, ...]:
    """The jobs of a sweep, op by op: one per distinct element count
    (rounding can map two sizes to one count), one for an unsized op, whose
    count is ``fixed[op]`` if given (the DDP model's parameters), else 0."""
    result: list[Job] = []
    for op in ops:
        case = CASES[op]
        if fixed and op in fixed:
            counts = {fixed[op]: None}
        else:
            counts = dict.fromkeys(case.count_for(size, itemsize, world_size) for size in sizes)
        result.extend(Job(op, count) for count in counts)
    return tuple(result)


def job_dtype(job: Job, plan_dtype: str) -> tuple[str, int]:
    """A job's element type (its case's own, else the run's) and its size in bytes."""
    dtype = CASES[job.op].dtype or plan_dtype
    return dtype, job.count * DTYPE_SIZES[dtype]


def zeros(count: int, dtype: str, array: str) -> Any:
    """A zeroed 1-d buffer: a torch CPU tensor or a NumPy array."""
    if array == "torch":
        import torch

        return torch.zeros(count, dtype=getattr(torch, dtype))
    import numpy as np

    return np.zeros(count, dtype=dtype)


def _all_reduce(comm: Any, p: Point) -> Calls:
    buf = p.buffer(p.count)
    return [lambda: comm.all_reduce(buf)]


def _broadcast(comm: Any, p: Point) -> Calls:
    buf = p.buffer(p.count)
    return [lambda: comm.broadcast(buf, 0)]


def _current(comm: Any, name: str, renamed: str) -> Callable[..., Any]:
    """``comm.renamed`` where it exists, else ``comm.name``: torch 2.13 renamed
    all_gather_into_tensor and reduce_scatter_tensor (``*_single``) and warns
    on every call of the old names, a cost that is not gloo's own."""
    return getattr(comm, renamed, None) or getattr(comm, name)


def _all_gather(comm: Any, p: Point) -> Calls:
    out, mine = p.buffer(p.count), p.buffer(p.count // p.world_size)
    gather = _current(comm, "all_gather_into_tensor", "all_gather_single")
    return [lambda: gather(out, mine)]


def _reduce_scatter(comm: Any, p: Point) -> Calls:
    whole, mine = p.buffer(p.count), p.buffer(p.count // p.world_size)
    reduce_scatter = _current(comm, "reduce_scatter_tensor", "reduce_scatter_single")
    return [lambda: reduce_scatter(mine, whole)]


def _all_to_all(comm: Any, p: Point) -> Calls:
    out, inp = p.buffer(p.count), p.buffer(p.count)
    return [lambda: comm.all_to_all_single(out, inp)]


def _barrier(comm: Any, p: Point) -> Calls:
    return [comm.barrier]


def _sendrecv(comm: Any, p: Point) -> Calls:
    """Ping-pong between ranks 0 and 1; the other ranks sit it out, waiting in
    the barrier that ends each repetition (what idle ranks cost the two is
    part of the row)."""
    if p.rank > 1:
        return []
    peer = p.rank ^ 1
    buf = p.buffer(p.count)
    send, recv = (lambda: comm.send(buf, peer)), (lambda: comm.recv(buf, peer))
    return [send, recv] if p.rank % 2 == 0 else [recv, send]


def _ring_factor(n: int) -> float:
    return (n - 1) / n


_ALL_GATHER_NOTE = "all_gather_into_tensor (all_gather_single where present); busbw = algbw * (n-1)/n"
_REDUCE_SCATTER_NOTE = "reduce_scatter_tensor (reduce_scatter_single where present); busbw = algbw * (n-1)/n"
_ALL_TO_ALL_NOTE = "all_to_all_single, equal splits; busbw = algbw * (n-1)/n"
_SENDRECV_NOTE = "ping-pong of ranks 0 and 1, any others idle; time = one-way (half the round trip), bw = size / time"

register(Case("all_reduce", _all_reduce, lambda n: 2 * (n - 1) / n, note="busbw = algbw * 2(n-1)/n"))
register(Case("broadcast", _broadcast, lambda n: 1.0, note="busbw = algbw"))
register(Case("all_gather", _all_gather, _ring_factor, split=True, note=_ALL_GATHER_NOTE))
register(Case("reduce_scatter", _reduce_scatter, _ring_factor, split=True, note=_REDUCE_SCATTER_NOTE))
register(Case("all_to_all", _all_to_all, _ring_factor, split=True, note=_ALL_TO_ALL_NOTE))
register(Case("barrier", _barrier, None, sized=False, note="time per barrier"))
register(Case("sendrecv", _sendrecv, lambda n: 1.0, legs=2, note=_SENDRECV_NOTE))
def _training_step(name: str, build: Callable[[Any, Point], Calls], note: str) -> Case:
    """A training-step row: unsized (its count is the model's parameters), float32,
    one step per repetition, through torch.distributed's API."""
    return Case(name, build, None, sized=False, torch_api=True, dtype="float32", one_per_rep=True, note=note)


register(_training_step("ddp_compute", ddp.build_compute,
                        "the DDP row's MLP step without DDP or communication (compute only); time per step"))
register(_training_step("ddp_flat", ddp.build_flat,
                        "the DDP row's MLP step, then its gradients flattened and all-reduced in one call "
                        "(no overlap); time per step"))
register(_training_step("ddp", ddp.build_step,
                        "DistributedDataParallel training step of an MLP, count = parameters; time per step; "
                        "asyncdist = its torch.distributed backend"))
register(_training_step("fsdp", fsdp.build_step,
                        "FSDP2 (fully_shard) training step of a small transformer LM, count = parameters; "
                        "time per step; asyncdist = its torch.distributed backend"))

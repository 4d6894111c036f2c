"""What a benchmark run measures: sizes, dtype, repetitions, and who runs it.

A :class:`Plan` is made once in the parent from the command line and sent,
pickled, to every rank process, so all ranks of every library measure the
same (op, element count) jobs with the same settings. It holds only plain
values: no library is imported here.

A :class:`Series` names one thing under test: a library and the API it is
driven through (asyncdist's await API, asyncdist's blocking facade,
torch.distributed on asyncdist's torch backend, or torch.distributed on
gloo). Each series runs in its own set of processes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

__all__ = ["Plan", "Job", "Series", "SERIES", "DTYPE_SIZES", "OVERHEAD_MAX_BYTES", "parse_bytes", "size_sweep", "format_bytes"]

#: The facade's per-call overhead is measured for jobs up to this size; above
#: it, copying the data dominates and the difference is mostly noise.
OVERHEAD_MAX_BYTES = 64 << 10

#: Bytes per element of the dtypes a sweep may use (torch's names).
DTYPE_SIZES = {
    "float32": 4,
    "float64": 8,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "int8": 1,
    "uint8": 1,
}

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """A size in bytes from ``"8"``, ``"1K"``, ``"64M"`` (binary units; ``KiB``/``KB`` also).

    Raises:
        ValueError: not a size.
    """
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(f"not a size: {text!r} (use e.g. 8, 1K, 64M)")
    return int(match.group(1)) * _UNITS[match.group(2).upper()]


def format_bytes(n: int) -> str:
    """``1024`` -> ``"1K"``; sizes that are not whole units stay in bytes."""
    for unit in ("G", "M", "K"):
        if n >= _UNITS[unit] and n % _UNITS[unit] == 0:
            return f"{n // _UNITS[unit]}{unit}"
    return str(n)


def size_sweep(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """``min_bytes``, ``min_bytes * factor``, ... up to ``max_bytes`` (inclusive).

    Raises:
        ValueError: ``min_bytes`` < 1, ``max_bytes`` < ``min_bytes`` or ``factor`` < 2.
    """
    if min_bytes < 1 or max_bytes < min_bytes or factor < 2:
        raise ValueError(f"bad sweep: {min_bytes}..{max_bytes} by x{factor} (need 1 <= min <= max, factor >= 2)")
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= factor
    return sizes


@dataclass(frozen=True, slots=True)
class Job:
    """One (op, element count) to measure; ``count`` is 0 for unsized ops (barrier)."""

    op: str
    count: int


@dataclass(frozen=True, slots=True)
class Series:
    """One thing under test: a library driven through one API."""

    library: str  # "asyncdist", "gloo" or "mpi"
    api: str  # "await", "facade", "backend" (torch.distributed over asyncdist), "torch" (gloo) or "mpi4py"

    @property
    def label(self) -> str:
        """Short name, for column headings and the plot's legend."""
        return {"facade": "asyncdist facade", "backend": "asyncdist backend"}.get(self.api, self.library)

    @property
    def reference(self) -> bool:
        """Another library, that asyncdist's series are compared with (a ratio column)."""
        return self.library != "asyncdist"

    @property
    def title(self) -> str:
        """Long name, for the header and progress lines."""
        return {"await": "asyncdist (await API)", "facade": "asyncdist (blocking facade)",
                "backend": "asyncdist (torch.distributed backend)", "mpi4py": "MPI (mpi4py)"}.get(
                    self.api, "torch.distributed gloo")


#: The series a run can include, by the name the command line uses. "backend"
#: (torch.distributed over asyncdist) runs with ``--api torch`` and for the
#: rows that need torch.distributed's API (the training steps).
SERIES = {
    "await": Series("asyncdist", "await"),
    "facade": Series("asyncdist", "facade"),
    "backend": Series("asyncdist", "backend"),
    "gloo": Series("gloo", "torch"),
    "mpi": Series("mpi", "mpi4py"),
}


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything a rank needs to measure its jobs (picklable, plain values).

    Attributes:
        world_size: ranks per series.
        dtype: element type, a key of :data:`DTYPE_SIZES`.
        array: ``"torch"`` or ``"numpy"`` buffers (gloo needs torch).
        jobs: what to measure, in order; the same on every rank and series.
        warmup: untimed calls before each job (also its time estimate).
        reps: timed repetitions per job; the report takes their median.
        iters: calls per repetition; 0 scales it so a repetition lasts
            ``min_rep_s`` (at most ``max_iters`` calls).
        paired: the facade's ranks also time each small job through the await
            API, on the facade's own loop, one repetition after each of the
            facade's: the facade's overhead is the difference of the pair.
        progress: rank 0 keeps a live progress line on stderr
            (:mod:`asyncdist.bench.progress`).
        stats: asyncdist's ranks read their counters (``group.stats()``) over
            each job's timed repetitions (``--stats``).
    """

    world_size: int
    dtype: str
    array: str
    jobs: tuple[Job, ...]
    warmup: int = 5
    reps: int = 5
    iters: int = 0
    min_rep_s: float = 0.020
    max_iters: int = 1000
    paired: bool = False
    progress: bool = False
    stats: bool = False

    def choose_iters(self, seconds_per_call: float) -> int:
        """Calls per repetition for a job whose calls take ``seconds_per_call``
        (the slowest rank's estimate, so every rank picks the same number)."""
        if self.iters:
            return self.iters
        if seconds_per_call <= 0:
            return self.max_iters
        return max(1, min(self.max_iters, math.ceil(self.min_rep_s / seconds_per_call)))

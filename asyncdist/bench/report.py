"""What a run prints: the header, nccl-tests-style tables, summaries, json.

Pure formatting over :class:`~asyncdist.bench.runner.Row` values: nothing
here starts a process or reads a clock. One table per op, one line per
size; each series that measured the op gets a column group (time, algbw,
busbw, and for small rows the time as a multiple of the socket floor,
:mod:`asyncdist.bench.floor`), then come the derived columns: the facade's
overhead over the await API (small sizes only, where it is not lost in data
movement) and, for each reference library (gloo, MPI), the ratio
``its time / asyncdist's time`` (> 1: asyncdist is faster), and with
``--api torch`` the torch backend's time over the facade's (its overhead).
After the tables come the summaries, and for ``--ops ddp`` each backend's
step broken down (:func:`ddp_lines`): compute only, no overlap, DDP, and the
communication the DDP step exposes.

The cell computations (a series' time, its multiple of the floor, a
reference's ratio, the facade's overhead) are public: :mod:`.markdown`
renders the same rows with them.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Callable

from . import ddp, fsdp
from .cases import CASES
from .floor import Floor
from .plan import OVERHEAD_MAX_BYTES, SERIES, Plan, Series, format_bytes
from .runner import Row

__all__ = [
    "OVERHEAD_MAX_BYTES", "FACADE_TARGET_US", "FLOOR_MAX_BYTES", "environment", "header", "method", "tables",
    "summary", "facade_overheads", "ratios", "to_json", "Cells", "any_row", "grouped", "references", "number",
    "time_of", "multiple_of", "ratio_of", "overhead_of", "BACKEND_OVERHEAD_TARGET", "backend_ratio_of", "ddp_lines",
]

#: What the issue asks of the blocking facade: at most this much per call over the await API.
FACADE_TARGET_US = 20

#: Rows up to this size (and the barrier) also show their time as a multiple
#: of the socket floor: below it, a call is a few wake-ups, not data movement.
FLOOR_MAX_BYTES = 1024

#: What the issue asks of the torch backend: at most this times the facade's time, at every size.
BACKEND_OVERHEAD_TARGET = 1.15

_AWAIT, _FACADE, _BACKEND = SERIES["await"], SERIES["facade"], SERIES["backend"]

Cells = dict[Series, Row]  # one size of one op: the row of each series


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def environment(loop: str) -> dict[str, str]:
    """Versions for the header and the json (no library is imported).

    Args:
        loop: the event loop the asyncdist ranks run (``"uvloop"``/``"asyncio"``).
    """
    return {
        "python": platform.python_version(),
        "torch": _version("torch"),
        "numpy": _version("numpy"),
        "asyncdist": _version("asyncdist"),
        "loop": loop if loop == "asyncio" else f"{loop} {_version('uvloop')} (await API; the facade: asyncio)",
        "platform": platform.platform(),
        "cpus": str(os.cpu_count()),
    }


def header(command: str, env: dict[str, str], plan: Plan, series: list[Series], sweep: str,
           floor: Floor | None = None) -> list[str]:
    """The lines printed before any result: command, versions, method."""
    return [
        f"# {command}",
        "# " + " | ".join(f"{name} {env[name]}" for name in ("python", "torch", "numpy", "asyncdist", "loop")),
        f"# {env['platform']}, {env['cpus']} CPUs",
    ] + method(plan, series, sweep, floor)


def method(plan: Plan, series: list[Series], sweep: str, floor: Floor | None = None) -> list[str]:
    """The header's lines on how a sweep measures (ranks, sizes, series,
    repetitions, the floor, the ratios), each starting ``# ``."""
    lines = [
        f"# {plan.world_size} ranks on this host, {plan.dtype} ({plan.array} buffers)"
        + (f", sizes {sweep}" if any(CASES[job.op].sized for job in plan.jobs) else ""),
        f"# series: {', '.join(s.title for s in series)} (each in its own processes, one after the other)",
        f"# per op and size: warm-up calls {plan.warmup}, then {plan.reps} repetitions of "
        + (f"{plan.iters} calls" if plan.iters else f">= {plan.min_rep_s * 1e3:g} ms (<= {plan.max_iters} calls)"),
        "# time = median over repetitions of the slowest rank's time per call; GB/s = 1e9 bytes/s",
    ]
    lines += [f"# ddp: {ddp.describe(job.count)}; one step per repetition" for job in plan.jobs if job.op == "ddp"]
    lines += [f"# fsdp: {fsdp.describe()}; one step per repetition" for job in plan.jobs if job.op == "fsdp"]
    if floor is not None:
        lines.append(f"# {floor.describe()}; xfloor = time / floor, for rows <= {format_bytes(FLOOR_MAX_BYTES)}")
    for ref in references(series):
        lines.append(f"# ratio = {ref.library} time / asyncdist time: > 1 means asyncdist is faster")
    if _FACADE in series and _BACKEND in series:
        lines.append(f"# ratio (torch/facade) = torch backend time / facade time: the backend's overhead, "
                     f"target <= {BACKEND_OVERHEAD_TARGET}")
    return lines


def references(series: list[Series]) -> list[Series]:
    return [s for s in series if s.reference]


@dataclass(frozen=True, slots=True)
class _Column:
    group: str
    name: str
    unit: str
    width: int
    cell: Callable[[Cells], str]


def number(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def any_row(cells: Cells) -> Row:
    return next(iter(cells.values()))


def _columns(series: list[Series], floor: Floor | None) -> list[_Column]:
    columns = [
        _Column("", "size", "(B)", 11, lambda c: str(any_row(c).nbytes)),
        _Column("", "count", "(elements)", 11, lambda c: str(any_row(c).count)),
        _Column("", "type", "", 8, lambda c: any_row(c).dtype if any_row(c).count else "-"),
    ]
    for s in series:
        columns += _series_columns(s, floor)
    mine = [s for s in series if not s.reference]
    if _AWAIT in series and _FACADE in series:
        columns.append(_Column("facade", "overhead", "(us)", 8, lambda c: number(overhead_of(c), "+.1f")))
    if _FACADE in series and _BACKEND in series:
        columns.append(_Column("", "ratio", "(torch/facade)", 8, lambda c: number(backend_ratio_of(c))))
    for ref in references(series):
        for s in mine:
            unit = f"({ref.library}/{s.api})" if len(mine) > 1 else f"({ref.library}/asyncdist)"
            columns.append(_ratio_column(ref, s, unit))
    return columns


def _series_columns(s: Series, floor: Floor | None) -> list[_Column]:
    columns = [_Column(s.label, "time", "(us)", 10, lambda c: number(time_of(c, s)))]
    if floor is not None:
        columns.append(_Column(s.label, "xfloor", "", 6, lambda c: number(multiple_of(c, s, floor), ".1f")))
    return columns + [
        _Column(s.label, "algbw", "(GB/s)", 7, lambda c: number(c[s].algbw if s in c else None)),
        _Column(s.label, "busbw", "(GB/s)", 7, lambda c: number(c[s].busbw if s in c else None)),
    ]


def _ratio_column(ref: Series, s: Series, unit: str) -> _Column:
    return _Column("", "ratio", unit, 8, lambda c: number(ratio_of(c, s, ref)))


def time_of(cells: Cells, series: Series) -> float | None:
    return cells[series].time_us if series in cells else None


def multiple_of(cells: Cells, series: Series, floor: Floor) -> float | None:
    """``series``' time in floors, for small rows (the barrier included, the DDP step not)."""
    row = cells.get(series)
    if row is None or row.nbytes > FLOOR_MAX_BYTES or (not row.nbytes and row.op != "barrier"):
        return None
    return row.time_us / floor.us


def ratio_of(cells: Cells, mine: Series, ref: Series) -> float | None:
    """``ref``'s time / ``mine``'s, where both ran."""
    theirs, ours = time_of(cells, ref), time_of(cells, mine)
    return theirs / ours if theirs and ours else None


def backend_ratio_of(cells: Cells) -> float | None:
    """The torch backend's time / the facade's, where both ran (> 1: the backend is slower)."""
    return ratio_of(cells, _FACADE, _BACKEND)


def overhead_of(cells: Cells) -> float | None:
    """The facade's time - the await API's, measured in pairs (see
    :attr:`~asyncdist.bench.plan.Plan.paired`), for small sizes."""
    return cells[_FACADE].overhead_us if _FACADE in cells else None


def grouped(rows: list[Row]) -> dict[str, dict[int, Cells]]:
    """rows -> op -> size in bytes -> series -> row (ops and sizes in run order)."""
    result: dict[str, dict[int, Cells]] = {}
    for row in rows:
        result.setdefault(row.op, {}).setdefault(row.nbytes, {})[row.series] = row
    return result


def _line(texts: list[str], widths: list[int], lead: str = " ") -> str:
    return lead + "  ".join(text.rjust(width) for text, width in zip(texts, widths))


def _group_line(columns: list[_Column], widths: list[int]) -> str:
    parts, i = [], 0
    while i < len(columns):
        j = i
        while j < len(columns) and columns[j].group == columns[i].group:
            j += 1
        span = sum(widths[i:j]) + 2 * (j - i - 1)
        parts.append(columns[i].group.center(span, "-" if columns[i].group else " "))
        i = j
    return ("#" + "  ".join(parts)).rstrip()


def tables(rows: list[Row], series: list[Series], floor: Floor | None = None) -> list[str]:
    """One table per op, as nccl-tests prints them, with the series that measured that op."""
    lines: list[str] = []
    for op, sizes in grouped(rows).items():
        columns = _columns([s for s in series if any(s in cells for cells in sizes.values())], floor)
        widths = [max(c.width, len(c.name), len(c.unit)) for c in columns]
        n = any_row(next(iter(sizes.values()))).world_size
        lines += ["", f"# {op}, {n} ranks: {CASES[op].note}", _group_line(columns, widths)]
        lines.append(_line([c.name for c in columns], widths, "#"))
        lines.append(_line([c.unit for c in columns], widths, "#"))
        lines += [_line([c.cell(cells) for c in columns], widths) for cells in sizes.values()]
    return lines


def facade_overheads(rows: list[Row]) -> dict[str, float]:
    """Per op, the median over sizes <= OVERHEAD_MAX_BYTES of facade time - await time (us)."""
    result = {}
    for op, sizes in grouped(rows).items():
        known = [d for cells in sizes.values() if (d := overhead_of(cells)) is not None]
        if known:
            result[op] = statistics.median(known)
    return result


def ratios(rows: list[Row], mine: Series, ref: Series) -> dict[str, float]:
    """Per op, the geometric mean over sizes of ``ref``'s time / ``mine``'s time."""
    result = {}
    for op, sizes in grouped(rows).items():
        known = [r for cells in sizes.values() if (r := ratio_of(cells, mine, ref))]
        if known:
            result[op] = math.exp(statistics.fmean(math.log(r) for r in known))
    return result


def stats_lines(rows: list[Row]) -> list[str]:
    """``--stats``: rank 0's counters over each row's timed calls, per call."""
    lines = ["", "# counters of rank 0 per call (group.stats() over the timed repetitions):"]
    for row in rows:
        stats = row.stats
        if stats is None:
            lines.append(f"#   {row.op} {format_bytes(row.nbytes)} ({row.series.label}): no counters (not asyncdist)")
            continue
        calls = max(row.iters * len(row.reps_us), 1)
        peers = stats["peers"].values()
        sent = sum(p["sent_bytes"] for p in peers) / calls
        messages = sum(p["sent_messages"] for p in peers) / calls
        received = sum(p["received_bytes"] for p in peers) / calls
        ops = ", ".join(f"{name} x{stat['count'] / calls:g}" for name, stat in sorted(stats["ops"].items()))
        lines.append(
            f"#   {row.op} {format_bytes(row.nbytes)} ({row.series.label}): sent {sent:g} B in {messages:g} messages, "
            f"received {received:g} B; ops {ops or 'none'}; in them {stats['wait_seconds'] / calls * 1e6:.1f} us; "
            f"same host {stats['same_host_bytes'] / calls:g} B, socket {stats['socket_bytes'] / calls:g} B"
        )
    return lines


def summary(rows: list[Row], series: list[Series]) -> list[str]:
    """Closing lines: the ratio per op, and the facade's overhead against its target."""
    lines = [""]
    for ref in references(series):
        for s in (s for s in series if not s.reference):
            per_op = ratios(rows, s, ref)
            if per_op:
                lines.append(f"# {ref.library} / {s.title} time, geometric mean over sizes (> 1: asyncdist faster):")
                lines.append("#   " + ", ".join(f"{op} {r:.2f}" for op, r in per_op.items()))
    lines += _backend_lines(rows)
    overheads = facade_overheads(rows)
    if overheads:
        lines.append(
            f"# facade overhead per call (facade - await API time, in the same processes, repetitions interleaved;"
            f" median over sizes <= {format_bytes(OVERHEAD_MAX_BYTES)}), target <= {FACADE_TARGET_US} us:"
        )
        lines.append("#   " + ", ".join(f"{op} {us:+.1f} us" for op, us in overheads.items()))
    return lines if len(lines) > 1 else []


def _backend_lines(rows: list[Row]) -> list[str]:
    """Per op, the worst and the geometric mean over sizes of torch backend time / facade time."""
    lines = []
    for op, sizes in grouped(rows).items():
        known = {size: r for size, cells in sizes.items() if (r := backend_ratio_of(cells))}
        if known:
            worst = max(known, key=known.__getitem__)
            mean = math.exp(statistics.fmean(math.log(r) for r in known.values()))
            lines.append(f"#   {op}: worst {known[worst]:.2f} at {format_bytes(worst)}, geometric mean {mean:.2f}")
    if not lines:
        return []
    return [f"# torch backend / facade time per size (target <= {BACKEND_OVERHEAD_TARGET}):"] + lines


def ddp_lines(rows: list[Row]) -> list[str]:
    """For each series that ran the DDP rows: the compute-only step, the
    no-overlap step, the DDP step, and the communication the DDP step exposes
    (DDP step - compute-only step), in ms."""
    by_op = grouped(rows)
    steps = {op: next(iter(by_op[op].values())) for op in ddp.STEP_OPS if op in by_op}
    if len(steps) < len(ddp.STEP_OPS):
        return []
    lines = ["", "# the DDP step, per backend, ms (median steps; exposed = DDP step - compute only):"]
    for s in steps["ddp"]:
        compute, flat, step = (steps[op][s].time_us / 1e3 if s in steps[op] else None for op in ddp.STEP_OPS)
        if compute is None or flat is None or step is None:
            continue
        lines.append(f"#   {s.label:>17}: compute only {compute:7.2f}, no overlap {flat:7.2f}, DDP {step:7.2f}, "
                     f"exposed {step - compute:+7.2f} (DDP / compute {step / compute:.2f}x)")
    return lines


def _row_json(row: Row, cells: Cells) -> dict[str, Any]:
    out: dict[str, Any] = {
        "op": row.op,
        "bytes": row.nbytes,
        "count": row.count,
        "dtype": row.dtype,
        "library": row.series.library,
        "api": row.series.api,
        "world_size": row.world_size,
        "time_us": row.time_us,
        "algbw_gbps": row.algbw,
        "busbw_gbps": row.busbw,
        "iters": row.iters,
        "reps_us": list(row.reps_us),
    }
    if not row.series.reference:
        for ref in (s for s in cells if s.reference):
            out[f"{ref.library}_ratio"] = ratio_of(cells, row.series, ref)
    if row.series == _BACKEND and (ratio := backend_ratio_of(cells)) is not None:
        out["facade_ratio"] = ratio
    if row.overhead_us is not None:
        out["facade_overhead_us"] = row.overhead_us
    return out


def to_json(
    command: str, env: dict[str, str], plan: Plan, sizes: list[int], series: list[Series], rows: list[Row],
    floor: Floor | None = None,
) -> dict[str, Any]:
    """The machine-readable report: one entry in ``rows`` per (op, size, library, api)."""
    by_op = grouped(rows)
    config = {
        "world_size": plan.world_size,
        "dtype": plan.dtype,
        "array": plan.array,
        "sizes": sizes,
        "ops": list(dict.fromkeys(job.op for job in plan.jobs)),
        "warmup": plan.warmup,
        "reps": plan.reps,
        "iters": plan.iters,
        "min_rep_ms": plan.min_rep_s * 1e3,
        "max_iters": plan.max_iters,
        "series": [f"{s.library}:{s.api}" for s in series],
    }
    config.update({"ddp_model": ddp.describe(job.count) for job in plan.jobs if job.op == "ddp"})
    config.update({"fsdp_model": fsdp.describe() for job in plan.jobs if job.op == "fsdp"})
    return {
        "command": command,
        "environment": env,
        "config": config,
        "rows": [_row_json(row, by_op[row.op][row.nbytes]) for row in rows],
        "facade_overhead_us": facade_overheads(rows),
        "floor_us": None if floor is None else {
            "floor": floor.us, "blocking": floor.blocking_us, floor.loop: floor.uvloop_us, "shm": floor.shm_us},
    }

"""``asyncdist-bench --report FILE.md``: the reference page of one machine, from one run.

The page (``docs/benchmarks.md`` is one) holds, in order: what it is and
the command that made it; the run's header (date, versions, machine, event
loop); the machine's floors (:mod:`asyncdist.bench.floor`) and its copy
bandwidth, with the least time each large row could take at it
(:mod:`asyncdist.bench.memcpy`); the sweep at 2 and at 4 ranks, await API
and facade against gloo and MPI, as Markdown tables
(:func:`asyncdist.bench.markdown.markdown_tables`), with their plots where
matplotlib is installed; the Python calls per operation
(:mod:`asyncdist.bench.calls`); and last the fixed prose on how to read
the tables and how to run the tool, the package's ``bench/reference.md``,
copied as it is. What could not run (MPI, gloo, the plots) is named in the
page with the reason, never a failure.

The page describes the software as the run found it: the date is in the
header and nowhere else, and no generated sentence compares with another
run.

This module owns the page: it measures what is not a sweep, renders, and
writes. The sweeps themselves are the command line's (the same function a
plain sweep runs): :mod:`asyncdist.bench.cli` passes a callable, so this
module does not import the command line, which imports it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any, Callable

from . import floor as floors
from . import markdown, memcpy, plot
from .floor import Floor
from .plan import Series
from .runner import Row

__all__ = ["WORLD_SIZES", "Sweep", "Measured", "measure", "render", "write"]

#: The world sizes the page shows, whatever ``--world-size`` says.
WORLD_SIZES = (2, 4)

#: ``calls.count_ops`` and ``calls.count_facade_all_reduce`` arguments per preset.
_CALL_COUNTS: dict[str, dict[str, int]] = {
    "default": {"iters": 200, "rounds": 3, "warmup": 50},
    "quick": {"iters": 20, "rounds": 2, "warmup": 10},
}
_FACADE_COUNTS: dict[str, dict[str, int]] = {
    "default": {"warmup": 50, "calls": 25},
    "quick": {"warmup": 10, "calls": 5},
}


@dataclass(frozen=True, slots=True)
class Sweep:
    """One world size's sweep: its series and rows, and the header's lines on how it measured."""

    world_size: int
    series: list[Series]
    rows: list[Row]
    method: list[str]  # report.method()'s lines


@dataclass(frozen=True, slots=True)
class Measured:
    """Everything the page shows.

    Attributes:
        command: the command line that made the page.
        date: when the run started (UTC), for the header.
        env: versions and machine (:func:`asyncdist.bench.report.environment`).
        preset: ``"default"`` or ``"quick"``.
        floor, copy_gbps: the floors, and one core's copy bandwidth (GB/s).
        sweeps: one per world size of :data:`WORLD_SIZES`.
        calls, facade_calls: :func:`~asyncdist.bench.calls.count_ops`'s results
            by event loop, and :func:`~asyncdist.bench.calls.count_facade_all_reduce`'s.
        plots: world size -> the plot's path relative to the page.
        notes: what was left out, and why.
    """

    command: str
    date: str
    env: dict[str, str]
    preset: str
    floor: Floor
    copy_gbps: float
    sweeps: list[Sweep]
    calls: dict[str, Any]
    facade_calls: dict[str, Any]
    plots: dict[int, str]
    notes: list[str]


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def measure(path: str | Path, *, command: str, env: dict[str, str], preset: str,
            sweep: Callable[[int], Sweep | None], notes: list[str]) -> Measured | None:
    """Run everything the page shows, and draw its plots beside ``path`` (blocks, minutes).

    Args:
        path: where the page will be written; plots go to the folder named as
            its stem (``docs/benchmarks.md`` -> ``docs/benchmarks/ranks2.png``).
        command, env: for the header.
        preset: ``"default"`` or ``"quick"`` (also sizes the call counts).
        sweep: runs the sweep at a world size; None if a series failed (the
            error is on stderr).
        notes: what the caller already left out (a reference library), and why.

    Returns:
        The measurements, or None if a sweep failed.
    """
    from . import calls  # not at import: `python -m asyncdist.bench.calls` must not find itself imported

    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    _say("measuring the floors and the copy bandwidth ...")
    the_floor, gbps = floors.measure(), memcpy.copy_gbps()
    sweeps = []
    for n in WORLD_SIZES:
        done = sweep(n)
        if done is None:
            return None
        sweeps.append(done)
    _say("counting the Python calls per operation ...")
    counts = {loop: calls.count_ops(**_CALL_COUNTS[preset], loop=loop) for loop in calls.available_loops()}
    facade = calls.count_facade_all_reduce(**_FACADE_COUNTS[preset])
    notes, plots = list(notes), {}
    if why := plot.missing():
        notes.append(f"plots: {why.replace('--plot needs', 'they need')}; this page has none")
    else:
        folder = Path(path).with_suffix("")
        folder.mkdir(parents=True, exist_ok=True)
        for s in sweeps:
            plot.write_plot(s.rows, folder / f"ranks{s.world_size}.png")
            plots[s.world_size] = f"{folder.name}/ranks{s.world_size}.png"
    return Measured(command, date, env, preset, the_floor, gbps, sweeps, counts, facade, plots, notes)


def write(path: str | Path, **kwargs: Any) -> int:
    """:func:`measure`, then write the page to ``path``; returns the exit status
    (0, or 1 if a sweep failed: no page is written then). Blocks, minutes."""
    measured = measure(path, **kwargs)
    if measured is None:
        return 1
    Path(path).write_text(render(measured))
    _say(f"page written to {path}")
    return 0


def render(m: Measured) -> str:
    """The page, as Markdown (pure: reads only ``m`` and ``bench/reference.md``)."""
    lines = _intro(m) + _floors(m) + _gap(m)
    for s in m.sweeps:
        lines += _sweep(s, m)
    lines += _calls(m)
    return "\n".join(lines) + "\n" + resources.files(__package__).joinpath("reference.md").read_text()


def _intro(m: Measured) -> list[str]:
    env = m.env
    lines = [
        "# Benchmarks",
        "",
        "<!-- Generated by asyncdist-bench --report: edit asyncdist/bench/document.py and "
        "asyncdist/bench/reference.md, then run it again; do not edit this page by hand. -->",
        "",
        "What asyncdist costs on one machine, measured by one command: the machine's floors, every "
        "collective and a point-to-point ping-pong at 2 and at 4 ranks, through asyncdist's await API and "
        "its blocking facade, against torch.distributed's gloo and MPI, and the Python calls each small "
        "operation makes. [How to read the tables](#how-to-read-the-tables) says what each column means; "
        "[How to run](#how-to-run) makes this page for another machine. Benchmarks are not tests: the "
        "test suite checks that the tool runs and what its output looks like, never a timing.",
        "",
        "## The run",
        "",
        "```bash",
        m.command,
        "```",
        "",
        "| | |",
        "|---|---|",
        f"| date | {m.date} |",
        *(f"| {name} | {env[key]} |" for name, key in (
            ("asyncdist", "asyncdist"), ("Python", "python"), ("torch", "torch"), ("NumPy", "numpy"),
            ("event loop", "loop"), ("platform", "platform"), ("CPUs", "cpus"))),
        f"| preset | {m.preset} |",
        "",
    ]
    if m.preset == "quick":
        lines += ["!!! note \"A smoke run\"", "    This page was made with `--quick`: small sizes only, few short "
                  "repetitions. It shows what the page holds, not figures to quote; the run without `--quick` is.",
                  ""]
    if m.notes:
        lines += ["Left out of this run:", "", *(f"* {note}" for note in m.notes), ""]
    return lines


def _floors(m: Measured) -> list[str]:
    f = m.floor
    shm = "-" if f.shm_us is None else f"{f.shm_us:.2f} us"
    return [
        "## Floors of this machine",
        "",
        "What no library can beat here: a small message is at least one wake-up of another process, "
        "a large one at least a copy of its bytes.",
        "",
        "| floor | value |",
        "|---|---:|",
        f"| **socket floor**: 8 B one way, the lower of the next two | **{f.us:.1f} us** |",
        f"| blocking sockets, ping-pong over TCP loopback, one way | {f.blocking_us:.1f} us |",
        f"| {f.loop} `asyncio.Protocol`, the same ping-pong | {f.uvloop_us:.1f} us |",
        f"| two shared-memory rings, both sides spinning, in Python, one way | {shm} |",
        f"| **copy bandwidth** of one core (NumPy copy of {markdown.size_text(memcpy.MEASURE_BYTES)}, "
        f"best of {memcpy.REPS}) | **{m.copy_gbps:.2f} GB/s** |",
        "",
    ]


def _gap(m: Measured) -> list[str]:
    cores = int(m.env["cpus"]) if m.env["cpus"].isdigit() else 1
    lines = [
        "## The gap to the hardware",
        "",
        "Every byte a call delivers to a rank is copied into that rank's memory at least once. For each "
        f"row of {markdown.size_text(memcpy.BOUND_MIN_BYTES)} or more, the least time is that of copying "
        f"those bytes at the copy bandwidth above, the receiving ranks' copies spread over the {cores} "
        "cores: least time = receivers x bytes each / (min(receivers, cores) x copy bandwidth), with, "
        "for a row of `size` bytes on n ranks:",
        "",
        "| op | bytes each receiving rank must receive per call |",
        "|---|---|",
        *(f"| {op} | {share.formula} |" for op, share in memcpy.MODEL.items()),
        "",
        "It is a lower bound: two cores copy less than twice what one does, and a reduction also reads "
        "the rank's own buffer. Each series' time is shown as a multiple of it (1.0 would be the hardware).",
        "",
    ]
    large = [(s.world_size, r) for s in m.sweeps for r in s.rows
             if r.nbytes >= memcpy.BOUND_MIN_BYTES and r.op in memcpy.MODEL]
    if not large:
        return lines + [f"No row of this run is {markdown.size_text(memcpy.BOUND_MIN_BYTES)} or more.", ""]
    series = list(dict.fromkeys(r.series for _, r in large))
    lines += ["| ranks | op | size | least (us) | " + " | ".join(f"{x.label} (x least)" for x in series) + " |",
              "|---:|---|---|---:|" + "---:|" * len(series)]
    for n, op, nbytes in dict.fromkeys((n, r.op, r.nbytes) for n, r in large):
        least = memcpy.least_us(op, nbytes, n, m.copy_gbps, cores) or float("nan")
        times = {r.series: r.time_us for k, r in large if (k, r.op, r.nbytes) == (n, op, nbytes)}
        cells = [f"{times[x] / least:.1f}" if x in times else "-" for x in series]
        lines.append(f"| {n} | {op} | {markdown.size_text(nbytes)} | {least:,.0f} | " + " | ".join(cells) + " |")
    lines.append("")
    return lines


def _sweep(s: Sweep, m: Measured) -> list[str]:
    n = s.world_size
    lines = [f"## {n} ranks", "", "```text", *s.method, "```", ""]
    if n in m.plots:
        lines += [f"![busbw and time against size, {n} ranks]({m.plots[n]})", ""]
    summary = markdown.markdown_summary(s.rows, s.series)
    if summary:
        lines += ["Per op, each reference's time over asyncdist's (geometric mean over sizes; > 1: asyncdist "
                  "is faster) and the facade's median overhead per call:", "", *summary, ""]
    return lines + markdown.markdown_tables(s.rows, s.series, m.floor)


def _calls(m: Measured) -> list[str]:
    from . import calls

    return [
        "## Python calls per operation",
        "",
        "Counted, not timed (`asyncdist-bench --count-calls`): the Python functions entered per 8 B "
        "operation, two ranks of the await API in one event loop, split by where the function "
        "lives; `(harness)` is the benchmark's own share of every row (a send+recv row is per pair: "
        "twice the harness's per-rank share is its). asyncio's event loop runs its own machinery in "
        "Python, uvloop's in C: each loop has its table. Then one blocking "
        "`dist.all_reduce` of the facade on two processes, counted on every thread of rank 0, and the "
        "asyncdist files it enters. Compare copies built alike: where the C extensions were not built, "
        "the flight recorder's ring is the Python one, which adds 3 Python calls per operation and rank.",
        "",
        *(line for loop, rows in m.calls.items() for line in (f"**{calls.LOOPS[loop]}**", "", *calls.table(rows), "")),
        "```text",
        *calls.facade_lines(m.facade_calls),
        "```",
        "",
    ]

"""``asyncdist-bench`` (also ``python -m asyncdist.bench``): the command line.

Parses the flags into a :class:`~asyncdist.bench.plan.Plan`, runs each
series in turn (:mod:`asyncdist.bench.runner`), and prints the header and
tables (:mod:`asyncdist.bench.report`), the json and the plot. Results go to
stdout; progress and notes go to stderr, so ``--json`` output pipes clean.

Presets fill the flags not given: the default sweeps 8 B .. 64 MiB by x4
with 5 repetitions of >= 20 ms (``-f 2`` for the full sweep); ``--quick``
is a smoke run for CI (8 B .. 64 KiB by x8, 3 short repetitions). Explicit
flags override both.

Every run first measures the socket floor (:mod:`asyncdist.bench.floor`)
and shows small rows as multiples of it. ``--compare gloo,mpi`` adds
reference columns: torch.distributed's gloo, and MPI through mpi4py
(:mod:`asyncdist.bench.mpi`; left out with a note where it is not
installed). On a terminal, rank 0 keeps a live progress line on stderr.

``--scale 8,16,64`` measures instead how the collectives scale with n in
one event loop (:mod:`asyncdist.bench.scale`): messages and bytes per rank,
counted, and time per call, for all_reduce and broadcast at 1 MiB unless
``-b``/``-e`` say otherwise.

``--count-calls`` counts instead the Python functions entered per 8 B
operation, await API and facade (:mod:`asyncdist.bench.calls`); ``--iters``
sets the iterations per counted window.

``--report FILE.md`` runs everything the reference page shows and writes it
(:mod:`asyncdist.bench.document`): the floors, the sweep at 2 and at 4 ranks
(``--api both --compare gloo,mpi``, whatever ``--world-size``, ``--api`` and
``--compare`` say; a reference that is not installed is left out with a
note in the page), the call counts and the plots. ``--quick`` and the
sweep's flags (``--ops``, ``-b``, ``-e``, ...) apply as to a plain sweep.
The sweeps are the plain sweep's own functions (:func:`_plan`,
:func:`_series`, :func:`_run`), run once per world size.

``--chaos`` runs instead the chaos benchmark (:mod:`asyncdist.bench.chaos`:
training while ranks are SIGKILLed and replaced); every other flag given
with it is the chaos benchmark's own (``asyncdist-bench --chaos --help``).

``--ops ddp`` adds the DDP training-step rows (:mod:`asyncdist.bench.ddp`:
the compute-only step, the step with one flattened all_reduce, the DDP
step) and ``--ops fsdp`` FSDP2's step (:mod:`asyncdist.bench.fsdp`); they
are not in the default ``--ops``: they need torch, and asyncdist runs them
through its torch backend, a series of its own.

``--api torch`` runs every op through torch.distributed on
``backend="asyncdist"`` beside the blocking facade, and prints the ratio of
the two times per size (the torch backend's overhead).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import sys
import traceback
from typing import Any, Sequence

from .. import settings
from ..loop.choice import LOOP_ENV
from . import document, floor, mpi, plot, report, scale
from .cases import CASES, jobs
from . import fsdp
from .ddp import STEP_OPS, mlp_params, mlp_width
from .plan import DTYPE_SIZES, SERIES, Plan, Series, format_bytes, parse_bytes, size_sweep
from .runner import Row, run_series, runs, series_plan

__all__ = ["main", "build_parser"]

PRESETS: dict[str, dict[str, Any]] = {
    "default": {
        "min_bytes": 8, "max_bytes": 64 << 20, "step_factor": 4,
        "warmup": 5, "reps": 5, "min_rep_ms": 20.0, "max_iters": 1000,
    },
    "quick": {
        "min_bytes": 8, "max_bytes": 64 << 10, "step_factor": 8,
        "warmup": 2, "reps": 3, "min_rep_ms": 2.0, "max_iters": 50,
    },
}


def _size(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


#: The default ``--ops``: every row but those that need torch.distributed's API (ddp, fsdp).
DEFAULT_OPS = [name for name, case in CASES.items() if not case.torch_api]
_COUNT_UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9}


def _count(text: str) -> int:
    """A count with a decimal suffix: ``4000``, ``4K``, ``10M``."""
    number, unit = text.strip()[:-1], text.strip()[-1:].upper()
    if unit not in _COUNT_UNITS:
        number, unit = text.strip(), ""
    if not number.isdigit() or int(number) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive count such as 4000, 4K or 10M, not {text!r}")
    return int(number) * _COUNT_UNITS[unit]


#: The libraries ``--compare`` accepts, by name.
REFERENCES = ("gloo", "mpi")


def _compare(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in REFERENCES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown library {unknown or text!r}; choose from {','.join(REFERENCES)}")
    return list(dict.fromkeys(names))


def _ranks(text: str) -> list[int]:
    try:
        ns = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        ns = []
    if not ns or min(ns) < 1:
        raise argparse.ArgumentTypeError(f"must be group sizes such as 8,16,64, not {text!r}")
    return ns


def _ops(text: str) -> list[str]:
    """The ops named, ``ddp`` standing for its three rows (:data:`~asyncdist.bench.ddp.STEP_OPS`)."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in CASES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown op(s) {unknown or text!r}; choose from {', '.join(CASES)}")
    expanded = [op for name in names for op in (STEP_OPS if name == "ddp" else (name,))]
    return list(dict.fromkeys(expanded))


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The argument parser (its defaults of None are filled from the preset)."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="nccl-tests-style benchmark of asyncdist's collectives and p2p, optionally against torch gloo.",
        epilog="Times are the median over repetitions of the slowest rank's time per call. "
        "See docs/benchmarks.md.",
    )
    p.add_argument("--world-size", type=int, default=2, help="ranks (processes on this host) per library (default 2)")
    p.add_argument("--ops", type=_ops, default=DEFAULT_OPS,
                   help=f"comma-separated ops, from {','.join(CASES)} (default all but the training steps; "
                   "ddp stands for ddp_compute,ddp_flat,ddp)")
    p.add_argument("-b", "--min-bytes", type=_size, help="smallest size, e.g. 8, 1K, 64M (default 8)")
    p.add_argument("-e", "--max-bytes", type=_size, help="largest size (default 64M; 64K with --quick)")
    p.add_argument("-f", "--step-factor", type=int, help="size multiplier between rows (default 4; 2 for a full sweep)")
    p.add_argument("--dtype", choices=list(DTYPE_SIZES), default="float32", help="element type (default float32)")
    p.add_argument("--api", choices=["await", "facade", "both", "torch"], default="await",
                   help="asyncdist face to time: the await API (default), the blocking facade, or both "
                   "(adds the facade's per-call overhead), or torch: the facade and torch.distributed on "
                   "backend='asyncdist' (adds the ratio torch backend / facade)")
    p.add_argument("--compare", type=_compare, default=[], metavar="gloo,mpi",
                   help="also run the sweep on torch.distributed's gloo backend and/or on MPI through mpi4py "
                   "(mpirun; left out with a note if mpi4py or mpirun is missing)")
    p.add_argument("--ddp-params", type=_count, default=10**7, metavar="N",
                   help="ddp: parameters of the MLP whose DistributedDataParallel training step is timed, "
                   "e.g. 10M (default); asyncdist runs it through its torch backend")
    p.add_argument("--warmup", type=int, help="warm-up calls per op and size (default 5)")
    p.add_argument("--reps", type=int, help="timed repetitions per op and size; the median is reported (default 5)")
    p.add_argument("--iters", type=int, default=0, help="calls per repetition (default 0: auto, see --min-rep-ms)")
    p.add_argument("--min-rep-ms", type=float, help="auto iters: make a repetition last at least this long (default 20)")
    p.add_argument("--max-iters", type=int, help="auto iters: at most this many calls per repetition (default 1000)")
    p.add_argument("--quick", action="store_true", help="smoke-run preset: 8..64K by x8, 3 short repetitions")
    p.add_argument("--loop", choices=["auto", "asyncio"], default="auto",
                   help="asyncdist's event loop: auto = uvloop (when installed) for the await API's ranks and "
                        "asyncio's for the facade's, as asyncdist chooses by default; asyncio = the standard one for both")
    p.add_argument("--json", nargs="?", const="-", metavar="FILE",
                   help="write the results as json to FILE, or to stdout instead of the tables if no FILE")
    p.add_argument("--plot", metavar="FILE.png",
                   help="draw busbw and latency against size (needs matplotlib: pip install 'asyncdist[plot]')")
    p.add_argument("--scale", type=_ranks, metavar="N,N,..",
                   help="instead of the sweep: messages and bytes per rank and time per call of all_reduce and "
                   "broadcast (of --ops) for these group sizes, as ranks in one event loop (default size 1M)")
    p.add_argument("--count-calls", action="store_true",
                   help="instead of the sweep: Python function calls per 8 B all_reduce, broadcast, barrier and "
                   "send+recv, counted with sys.setprofile, and the files one facade all_reduce enters "
                   "(python -m asyncdist.bench.calls; --iters sets the iterations, default 200)")
    p.add_argument("--stats", action="store_true",
                   help="print rank 0's counters per row: bytes and messages per peer, operations, time in them")
    p.add_argument("--report", metavar="FILE.md",
                   help="write the reference page (docs/benchmarks.md): floors, the sweep at 2 and 4 ranks "
                   "against gloo and MPI, call counts, plots")
    p.add_argument("--chaos", action="store_true",
                   help="instead of the sweep: the chaos benchmark, training while ranks are SIGKILLed and replaced "
                   "(python -m asyncdist.bench.chaos; the other flags are then its own: --chaos --help)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds one library's whole sweep may take (default 1800)")
    return p


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    preset = PRESETS["quick" if args.quick else "default"]
    return {key: preset[key] if getattr(args, key) is None else getattr(args, key) for key in preset}


def _loop_kind(choice: str) -> str:
    """The event loop the asyncdist ranks will run."""
    if choice == "asyncio" or settings.current().loop == "asyncio":
        return "asyncio"
    return "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"


_API_SERIES = {"await": ["await"], "facade": ["facade"], "both": ["await", "facade"], "torch": ["facade", "backend"]}


def _series(args: argparse.Namespace) -> list[Series]:
    """The series asked for that measure at least one of the ops (the torch
    backend's for ``--api torch`` and for the training steps)."""
    names = _API_SERIES[args.api]
    if any(CASES[op].torch_api for op in args.ops) and "backend" not in names:
        names = names + ["backend"]
    candidates = [SERIES[name] for name in names + args.compare]
    return [s for s in candidates if any(runs(s, op) for op in args.ops)]


def _plan(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[Plan, list[int]]:
    s = _settings(args)
    if args.world_size < 1:
        parser.error("--world-size must be at least 1")
    if s["reps"] < 1 or s["warmup"] < 0 or args.iters < 0 or s["max_iters"] < 1:
        parser.error("--reps and --max-iters must be >= 1, --warmup and --iters >= 0")
    if not args.iters and s["warmup"] < 1:
        parser.error("automatic --iters needs --warmup >= 1 (the warm-up calls give the estimate)")
    try:
        sizes = size_sweep(s["min_bytes"], s["max_bytes"], s["step_factor"])
    except ValueError as exc:
        parser.error(str(exc))
    torch = importlib.util.find_spec("torch") is not None
    if "gloo" in args.compare and not torch:
        parser.error("--compare gloo needs torch (pip install 'asyncdist[torch]')")
    if args.plot and (why := plot.missing()):
        parser.error(why)
    if "mpi" in args.compare and (why := mpi.missing(args.dtype)):
        print(f"note: --compare mpi: {why}; the MPI column is left out", file=sys.stderr)
        args.compare.remove("mpi")
    if args.dtype == "bfloat16" and not torch:
        parser.error("--dtype bfloat16 needs torch (NumPy has no bfloat16)")
    if not torch and (needs := [op for op in args.ops if CASES[op].torch_api] + (["--api torch"] if args.api == "torch" else [])):
        parser.error(f"{', '.join(needs)} needs torch (pip install 'asyncdist[torch]')")
    ops = list(args.ops)
    if args.world_size < 2 and "sendrecv" in ops:
        ops.remove("sendrecv")
        print("note: sendrecv needs 2 ranks; left out", file=sys.stderr)
    plan = Plan(
        world_size=args.world_size,
        dtype=args.dtype,
        array="torch" if torch else "numpy",
        jobs=jobs(ops, sizes, DTYPE_SIZES[args.dtype], args.world_size,
                  fixed={**dict.fromkeys(STEP_OPS, mlp_params(mlp_width(args.ddp_params))), "fsdp": fsdp.params()}),
        warmup=s["warmup"],
        reps=s["reps"],
        iters=args.iters,
        min_rep_s=s["min_rep_ms"] / 1e3,
        max_iters=s["max_iters"],
        paired=args.api == "both",
        progress=sys.stderr.isatty(),
        stats=args.stats,
    )
    return plan, sizes


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Run the benchmark; returns the exit status (0, or 1 if a library's run failed).

    Args:
        argv: the arguments (default ``sys.argv[1:]``).
        prog: the program name shown in the header and ``--help``.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = prog or os.path.basename(sys.argv[0]) or "asyncdist-bench"
    if "--chaos" in argv:
        # Imported here, as calls below: `python -m asyncdist.bench.chaos` must not find itself imported.
        from . import chaos

        return chaos.main([arg for arg in argv if arg != "--chaos"], prog=f"{prog} --chaos")
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if args.report and (args.scale or args.count_calls or args.json or args.plot):
        parser.error("--report writes the page alone: leave out --scale, --count-calls, --json and --plot")
    if args.scale:
        return _scale(args)
    if args.count_calls:
        # Imported here: imported with this module, `python -m asyncdist.bench.calls`
        # would find itself imported before it runs (runpy warns).
        from . import calls

        return calls.main(["--iters", str(args.iters)] if args.iters else [])
    command = " ".join([prog, shlex.join(argv)]) if argv else prog
    env = report.environment(_loop_kind(args.loop))
    if args.report:
        return _report(args, parser, prog, command, env)
    plan, sizes = _plan(args, parser)
    series = _series(args)
    print("measuring the socket floor ...", file=sys.stderr, flush=True)
    the_floor = floor.measure()
    text_out = args.json != "-"
    if text_out:
        print("\n".join(report.header(command, env, plan, series, _sweep_text(args, sizes), the_floor)), flush=True)

    rows = _run(series, plan, prog, timeout=args.timeout, env=_rank_env(args))
    if rows is None:
        return 1
    if text_out:
        print("\n".join(report.tables(rows, series, the_floor) + report.summary(rows, series) + report.ddp_lines(rows)))
        if args.stats:
            print("\n".join(report.stats_lines(rows)))
    if args.json:
        document = json.dumps(report.to_json(command, env, plan, sizes, series, rows, the_floor), indent=2)
        if args.json == "-":
            print(document)
        else:
            with open(args.json, "w") as f:
                f.write(document + "\n")
    if args.plot:
        plot.write_plot(rows, args.plot)
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0


def _sweep_text(args: argparse.Namespace, sizes: list[int]) -> str:
    return f"{format_bytes(sizes[0])}..{format_bytes(sizes[-1])} x{_settings(args)['step_factor']}"


def _rank_env(args: argparse.Namespace) -> dict[str, str] | None:
    """Extra environment for asyncdist's ranks (``--loop asyncio``)."""
    return {LOOP_ENV: "asyncio"} if args.loop == "asyncio" else None


def _report(args: argparse.Namespace, parser: argparse.ArgumentParser, prog: str, command: str,
            env: dict[str, str]) -> int:
    """``--report``: the plain sweep at each of the page's world sizes, and the page."""
    missing = {"gloo": None if importlib.util.find_spec("torch") else "torch is not installed "
               "(pip install 'asyncdist[torch]')", "mpi": mpi.missing(args.dtype)}
    notes = [f"the {SERIES[name].title} columns: {why}" for name, why in missing.items() if why]
    compare = [name for name, why in missing.items() if not why]

    def sweep(n: int) -> document.Sweep | None:
        run = argparse.Namespace(**{**vars(args), "world_size": n, "api": "both", "compare": list(compare)})
        plan, sizes = _plan(run, parser)
        series = _series(run)
        rows = _run(series, plan, prog, timeout=args.timeout, env=_rank_env(args))
        if rows is None:
            return None
        return document.Sweep(n, series, rows, report.method(plan, series, _sweep_text(run, sizes)))

    return document.write(args.report, command=command, env=env, preset="quick" if args.quick else "default",
                          sweep=sweep, notes=notes)


def _scale(args: argparse.Namespace) -> int:
    """``--scale``: one Markdown table of every (op, size, n)."""
    explicit = args.min_bytes is not None or args.max_bytes is not None
    sizes = size_sweep(args.min_bytes or 8, args.max_bytes or 64 << 20, args.step_factor or 4) if explicit else [1 << 20]
    ops = [op for op in args.ops if op in scale.SCALE_OPS] or list(scale.SCALE_OPS)
    rows = []
    for op in ops:
        for nbytes in sizes:
            print(f"scale: {op} {format_bytes(nbytes)} at n = {','.join(map(str, args.scale))} ...", file=sys.stderr, flush=True)
            rows += scale.measure(op, nbytes, args.scale)
    print("\n".join(scale.table(rows)))
    return 0


def _run(series: list[Series], plan: Plan, prog: str, *, timeout: float, env: dict[str, str] | None) -> list[Row] | None:
    """Every series' rows, one series after the other; None (and the error on
    stderr) if one failed."""
    rows: list[Row] = []
    for s in series:
        count = len(series_plan(s, plan).jobs)
        print(f"running {s.title}: {count} jobs on {plan.world_size} ranks ...", file=sys.stderr, flush=True)
        try:
            rows += run_series(s, plan, timeout=timeout, env=env)
        except Exception as exc:
            print(f"{prog}: the {s.title} run failed: {exc!r}", file=sys.stderr)
            if exc.__cause__ is not None:  # spawn's RemoteTraceback: the rank's own traceback
                print(str(exc.__cause__), file=sys.stderr)
            else:
                traceback.print_exc()
            return None
    return rows

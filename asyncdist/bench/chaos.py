"""``python -m asyncdist.bench.chaos`` (also ``asyncdist-bench --chaos``): training through SIGKILLs.

N worker processes on this host train :mod:`~asyncdist.bench.chaos_model`'s
MLP (batch ``s`` drawn from step ``s``) for a fixed wall time. Every K
seconds (the first after K/2) a seeded schedule SIGKILLs a random member
(never the last one, never the slot killed just before) and starts a
replacement process at once. Each path runs with and without the kills, in
``--rounds`` alternating parts (with, without; then without, with; ...), so
that a machine whose speed drifts over minutes weighs on both alike; the
parts' steps and seconds add up. It reports:

* steps per second with faults, and the share kept of the fault-free run's;
* per kill, from the signal (``time.monotonic()``, one clock for every process of
  a host): *detection*, to the first survivor's failed step; *new group*, to
  the last survivor's new group (asyncdist's shrink, torchft's next quorum);
  *recovery*, to the last survivor's first step committed in it (p50, p95, max);
* *start-up*: from a replacement's start until it is ready to join (the
  interpreter, the imports: torch's for torchft; its Manager);
* *admission*: from then to its first step in the job (asyncdist: the
  survivors' ``grow_group`` and the weights' broadcast; torchft: the quorum
  that takes it in and its healing by checkpoint transfer);
* *weights*: every finishing worker's final weights against a fault-free
  sequential run of as many steps (:func:`~asyncdist.bench.chaos_model.references`):
  PASS only if each matches, so no failed step was half-applied or lost.

The paths (:mod:`~asyncdist.bench.chaos_worker` says how each trains):
``asyncdist``, asyncdist's own shrink and grow through the facade;
``torchft-asyncdist``, torchft's ``Manager`` over ``asyncdist.torchft.ProcessGroupAsyncdist``;
``torchft-gloo``, the same over torchft's ``ProcessGroupGloo``. A path whose
packages are not installed is reported "not available". One run of one path
is :mod:`~asyncdist.bench.chaos_driver`'s; this module runs the rounds and the
paths, checks the weights and prints the table.

``--ci`` is the tiny form: 3 ranks, 2 kills, each kill after the previous
one has recovered and its replacement was admitted (``--settle``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
from dataclasses import asdict, dataclass, replace
from typing import IO, Any, Sequence

import numpy as np

from .chaos_driver import Kill, Options, Run, run_path
from .chaos_model import Model, matches, references

__all__ = ["Options", "Kill", "Run", "PathResult", "PATHS", "available", "run_path", "run_rounds", "run", "main"]

#: The paths, in the order they run: (a), (b), (c).
PATHS = ("asyncdist", "torchft-asyncdist", "torchft-gloo")


@dataclass
class PathResult:
    """A path's runs (with and without faults), or why it did not run."""

    path: str
    missing: str | None = None
    faulty: Run | None = None
    clean: Run | None = None
    passed: bool | None = None


def available(path: str) -> str | None:
    """None if ``path`` can run here, else why not."""
    if path != "asyncdist" and importlib.util.find_spec("torchft") is None:
        return "torchft is not installed (pip install torchft)"
    if path == "torchft-asyncdist":
        try:  # imported, not only found: it needs torchft and this asyncdist's torch backend to import
            importlib.import_module("asyncdist.torchft")
        except ImportError as exc:
            return f"asyncdist.torchft does not import here ({exc})"
    return None


def run_rounds(path: str, opts: Options, log: IO[str]) -> tuple[Run, Run | None]:
    """``path``'s runs with faults and without, in ``opts.rounds`` alternating parts each.

    ``--kills`` bounds the kills of all the parts together.
    """
    clean_seconds = opts.duration if opts.baseline is None else opts.baseline
    faulty: list[Run] = []
    clean: list[Run] = []
    for i in range(opts.rounds):
        for faults in ((True, False) if i % 2 == 0 else (False, True)):
            if not faults and clean_seconds == 0:
                continue
            print(f"chaos: {path}: round {i + 1} of {opts.rounds}, {'with' if faults else 'without'} faults ...",
                  file=log, flush=True)
            if faults:
                left = None if opts.kills is None else opts.kills - sum(len(p.kills) for p in faulty)
                faulty.append(run_path(path, replace(opts, kills=left), True, opts.duration / opts.rounds))
            else:
                clean.append(run_path(path, opts, False, clean_seconds / opts.rounds))
    return Run.joined(faulty), Run.joined(clean) if clean else None


def run(paths: Sequence[str], opts: Options, log: IO[str] = sys.stderr) -> list[PathResult]:
    """Every path asked for, with and without faults, and the weights of each checked."""
    results = []
    for path in paths:
        result = PathResult(path, missing=available(path))
        if result.missing is None:
            print(f"chaos: {path}: {opts.ranks} ranks, a kill every {opts.interval:g} s for {opts.duration:g} s ...",
                  file=log, flush=True)
            result.faulty, result.clean = run_rounds(path, opts, log)
        results.append(result)
    counts = sorted({steps for r in results for run_ in (r.faulty, r.clean) if run_ for steps, _ in run_.weights})
    if counts:
        print(f"chaos: the sequential reference, {counts[-1]} steps ...", file=log, flush=True)
    expected = references(opts.model, counts)
    for r in results:
        runs = [run_ for run_ in (r.faulty, r.clean) if run_ is not None]
        if runs:
            r.passed = all(matches(w, expected[steps]) for run_ in runs for steps, w in run_.weights)
    return results


def _ms(values: Sequence[float]) -> str:
    return f"{statistics.median(values) * 1e3:.0f}" if values else "-"


def _spread(values: Sequence[float], scale: float, unit: str) -> str:
    """p50 / p95 / max of ``values`` (nearest rank), in ``unit``."""
    if not values:
        return "-"
    v = sorted(values)
    p95 = v[min(len(v) - 1, max(0, int(np.ceil(0.95 * len(v))) - 1))]
    return f"{statistics.median(v) * scale:.0f} / {p95 * scale:.0f} / {v[-1] * scale:.0f} {unit}"


def table(results: Sequence[PathResult], opts: Options) -> list[str]:
    """The Markdown table of the paths, side by side."""
    lines = [
        "| path | steps/s, no fault | steps/s, faults | kept | kills | recovery p50 / p95 / max "
        "| detection p50 | new group p50 | start-up p50 | admission p50 / p95 / max | weights |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if r.missing is not None or r.faulty is None:
            lines.append(f"| {r.path} | not available: {r.missing} |" + " |" * 9)
            continue
        f, c = r.faulty, r.clean
        kills = f.kills
        recovered = [k.recovery for k in kills if k.recovery is not None]
        lost = len(kills) - len(recovered)
        kept = f"{f.rate / c.rate * 100:.1f} %" if c is not None and c.rate else "-"
        lines.append(
            f"| {r.path} | {f'{c.rate:.0f}' if c else '-'} | {f.rate:.0f} | {kept} | {len(kills)}"
            f"{f' ({lost} not recovered)' if lost else ''} | {_spread(recovered, 1e3, 'ms')} "
            f"| {_ms([k.detection for k in kills if k.detection is not None])} ms "
            f"| {_ms([k.new_group for k in kills if k.new_group is not None])} ms "
            f"| {_ms(f.startups)} ms | {_spread(f.admissions, 1e3, 'ms')} | {'PASS' if r.passed else 'FAIL'} |")
    return lines


def to_json(results: Sequence[PathResult], opts: Options) -> dict:
    """The results as a json-able dict (the weights left out)."""
    def run_(r: Run | None) -> dict | None:
        if r is None:
            return None
        return {"steps": r.steps, "seconds": r.seconds, "rate": r.rate, "startups": r.startups,
                "admissions": r.admissions,
                "kills": [asdict(k) for k in r.kills]}

    return {"options": {**asdict(opts)}, "paths": [
        {"path": r.path, "missing": r.missing, "passed": r.passed, "faulty": run_(r.faulty), "clean": run_(r.clean)}
        for r in results]}


def _paths(text: str) -> list[str]:
    names = {"a": "asyncdist", "b": "torchft-asyncdist", "c": "torchft-gloo"}
    chosen = [names.get(part.strip(), part.strip()) for part in text.split(",") if part.strip()]
    unknown = [p for p in chosen if p not in PATHS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"unknown path(s) {unknown or text!r}; choose from a,b,c or {','.join(PATHS)}")
    return chosen


def build_parser(prog: str) -> argparse.ArgumentParser:
    """The command line's flags (see the module's docstring)."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0].split(": ", 1)[-1])
    p.add_argument("--paths", type=_paths, default=list(PATHS), help="a,b,c or their names (default all)")
    p.add_argument("--ranks", type=int, help="worker processes (default 8; 3 with --ci)")
    p.add_argument("--duration", type=float, help="seconds of training per run (default 180; 3 with --ci)")
    p.add_argument("--interval", type=float, help="seconds between kills (default 10; 1 with --ci)")
    p.add_argument("--kills", type=int, help="at most this many kills per run (default: no limit; 2 with --ci)")
    p.add_argument("--baseline", type=float, help="seconds of the fault-free runs (default: --duration; 0: none)")
    p.add_argument("--rounds", type=int,
                   help="the runs with and without faults alternate in this many parts each (default 3; 1 with --ci)")
    p.add_argument("--seed", type=int, default=0, help="the kill schedule's and the model's seed (default 0)")
    p.add_argument("--settle", action="store_true", default=None,
                   help="kill only once the previous kill recovered and its replacement was admitted")
    p.add_argument("--hidden", type=int, default=64, help="the MLP's hidden width (default 64)")
    p.add_argument("--timeout", type=float, default=10.0,
                   help="torchft: the Manager's timeout, so its process group's, in seconds (default 10)")
    p.add_argument("--heartbeat-ms", type=int, help="torchft: the lighthouse's heartbeat timeout (default torchft's)")
    p.add_argument("--ci", action="store_true", help="the tiny form: 3 ranks, 2 settled kills, 3 s runs")
    p.add_argument("--json", metavar="FILE", help="also write the results as json to FILE")
    return p


def options(args: argparse.Namespace) -> Options:
    """The :class:`Options` of parsed flags (``--ci`` fills those not given)."""
    preset: dict[str, Any] = ({"ranks": 3, "duration": 3.0, "interval": 1.0, "kills": 2, "settle": True, "rounds": 1}
                              if args.ci else {})
    defaults = Options()

    def pick(name: str) -> Any:
        value = getattr(args, name)
        return value if value is not None else preset.get(name, getattr(defaults, name))

    return Options(ranks=pick("ranks"), duration=pick("duration"), rounds=pick("rounds"), interval=pick("interval"),
                   kills=pick("kills"),
                   baseline=args.baseline, seed=args.seed, settle=bool(pick("settle")), timeout=args.timeout,
                   heartbeat_ms=args.heartbeat_ms, model=Model(hidden=args.hidden, seed=args.seed))


def main(argv: Sequence[str] | None = None, prog: str = "python -m asyncdist.bench.chaos") -> int:
    """Run the chaos benchmark and print its table; 1 if a path's weights FAIL or a run failed."""
    args = build_parser(prog).parse_args(argv)
    opts = options(args)
    if opts.ranks < 2:
        print(f"{prog}: --ranks must be at least 2 (a kill leaves one member at least)", file=sys.stderr)
        return 2
    if opts.rounds < 1:
        print(f"{prog}: --rounds must be at least 1", file=sys.stderr)
        return 2
    try:
        results = run(args.paths, opts)
    except RuntimeError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    command = " ".join([prog, *(argv if argv is not None else sys.argv[1:])])
    print(f"{command}\n\n{opts.ranks} ranks, a kill every {opts.interval:g} s, {opts.duration:g} s with faults and "
          f"{opts.duration if opts.baseline is None else opts.baseline:g} s without, in {opts.rounds} alternating "
          f"rounds; "
          f"times from the SIGKILL; start-up from a replacement's start, admission from then\n")
    print("\n".join(table(results, opts)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(to_json(results, opts), f, indent=2)
    return 0 if all(r.passed is not False for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

"""``asyncdist-trace``: ``analyze DIR [--json]``, ``timeline DIR -o trace.json``
and ``export DIR --torch OUT`` (torch's flight-recorder format, :mod:`.torch_fr`).

Example::

    $ asyncdist-trace analyze /tmp/traces
    4 of 4 ranks dumped:
    - rank 3 is behind on group world: it is at all_reduce #56 on group world
      (all_reduce(sum, float32[4]), completed), while ranks [0, 1, 2] wait in
      call #57 (all_reduce(sum, float32[4])); rank 3's main thread is in
      train.py:40 in load (time.sleep(3600)), outside any asyncdist call
    $ asyncdist-trace timeline /tmp/traces -o trace.json   # open in ui.perfetto.dev
    $ asyncdist-trace export /tmp/traces --torch /tmp/fr
    $ python -m torch.distributed.flight_recorder.fr_trace /tmp/fr --prefix torch-fr-rank
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from ..errors import InvalidArgumentError
from .analyze import analyze, as_json, as_text
from .load import load
from .timeline import timeline
from .torch_fr import FR_PREFIX, write_torch_dumps

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asyncdist-trace", description="Read asyncdist's flight-recorder dumps.")
    commands = parser.add_subparsers(dest="command", required=True)
    read = commands.add_parser("analyze", help="say which rank is behind, disagrees or died")
    read.add_argument("folder", help="a folder of asyncdist-trace-rank<R>.json (ASYNCDIST_TRACE_DIR)")
    read.add_argument("--json", action="store_true", help="print the findings as JSON")
    draw = commands.add_parser("timeline", help="write a Chrome/Perfetto trace of every rank's operations")
    draw.add_argument("folder", help="a folder of asyncdist-trace-rank<R>.json")
    draw.add_argument("-o", "--output", default="trace.json", help="the trace file to write (default trace.json)")
    export = commands.add_parser("export", help="write the dumps in another tool's format")
    export.add_argument("folder", help="a folder of asyncdist-trace-rank<R>.json")
    export.add_argument("--torch", required=True, metavar="OUT",
                        help=f"a folder for torch's flight-recorder analyzer: one {FR_PREFIX}<R> per rank")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status (1: the dumps could not be read)."""
    args = _parser().parse_args(argv)
    try:
        trace = load(args.folder)
    except InvalidArgumentError as exc:
        print(f"asyncdist-trace: {exc}", file=sys.stderr)
        return 1
    if args.command == "analyze":
        findings = analyze(trace)
        print(json.dumps(as_json(trace, findings), indent=2) if args.json else as_text(trace, findings))
        return 0
    if args.command == "export":
        paths = write_torch_dumps(trace, args.torch)
        print(f"asyncdist-trace: wrote {len(paths)} dumps to {args.torch}; read them with "
              f"python -m torch.distributed.flight_recorder.fr_trace {args.torch} --prefix {FR_PREFIX}")
        return 0
    with open(args.output, "w") as out:
        json.dump(timeline(trace), out)
    print(f"asyncdist-trace: wrote {args.output} (open it in https://ui.perfetto.dev or chrome://tracing)")
    return 0

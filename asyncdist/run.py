"""``asyncdist-run`` (also ``python -m asyncdist.run``): torchrun for asyncdist.

Starts ``--nproc-per-node`` workers on this node with the environment that
``init_process_group()`` reads, serves the job's store on node 0, prefixes
every output line with the worker's rank, stops every worker when one fails
(exit code 1, naming the rank and its exit code) or when the launcher is
interrupted, and restarts the group up to ``--max-restarts`` times::

    asyncdist-run --standalone --nproc-per-node 4 train.py --epochs 3
    asyncdist-run --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29500 --nproc-per-node 8 train.py

Flags, environment and behaviour: ``docs/launcher.md``. The work is done in
:mod:`asyncdist.launcher`; this module is the command line's entry point.
"""

from __future__ import annotations

import sys

from .launcher import launch
from .launcher.args import build_parser, config_from_args

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the job, exit with its code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    sys.exit(launch(config))


if __name__ == "__main__":
    main()

"""``python -m asyncdist.launch``: the deprecated ``torch.distributed.launch``, kept for old scripts.

It starts ``--nproc_per_node`` workers like ``asyncdist-run`` does (same
store, environment, output prefixes and failure handling), and, as the old
utility did, passes each worker ``--local_rank=N`` right after the script
name, unless ``--use_env`` is given, in which case the worker reads
``LOCAL_RANK`` from its environment (set in both cases). New scripts should
use ``asyncdist-run``, which never passes ``--local_rank``.
"""

from __future__ import annotations

import argparse
import sys

from .launcher import launch
from .launcher.args import LaunchConfig, worker_command

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    """The old launch utility's flags (underscore spellings, as documented; dashes also work)."""
    parser = argparse.ArgumentParser(
        prog="python -m asyncdist.launch",
        description="Deprecated: use asyncdist-run. Spawns NPROC_PER_NODE workers of a training script "
        "on this node, passing --local_rank=N to each unless --use_env is given.",
    )
    add = parser.add_argument
    add("--nnodes", type=int, default=1, help="Number of nodes (default 1).")
    add("--node_rank", "--node-rank", type=int, default=0, help="This node's index (default 0).")
    add("--nproc_per_node", "--nproc-per-node", type=int, default=1, help="Workers on this node (default 1).")
    add("--master_addr", "--master-addr", default="127.0.0.1", help="Address of node 0 (default 127.0.0.1).")
    add("--master_port", "--master-port", type=int, default=29500, help="Port of node 0's store (default 29500).")
    add("--use_env", "--use-env", action="store_true",
        help="Do not pass --local_rank; the worker reads LOCAL_RANK from its environment.")
    add("-m", "--module", action="store_true", help="Run the script as a module, like 'python -m'.")
    add("--no_python", "--no-python", action="store_true", help="Run the script without the Python interpreter.")
    add("training_script", help="The training program, followed by its arguments.")
    add("training_script_args", nargs=argparse.REMAINDER)
    return parser


def main(argv: list[str] | None = None) -> None:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the job, exit with its code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    print("asyncdist.launch: FutureWarning: this module is deprecated, as torch.distributed.launch is; "
          "use asyncdist-run, and read LOCAL_RANK from the environment instead of a --local_rank argument",
          file=sys.stderr, flush=True)
    if args.nproc_per_node < 1 or not 0 <= args.node_rank < args.nnodes:
        parser.error("--nproc_per_node must be at least 1 and --node_rank in [0, --nnodes)")
    try:
        command = worker_command(args.training_script, module=args.module, no_python=args.no_python)
    except ValueError as exc:
        parser.error(str(exc))
    config = LaunchConfig(
        command=command,
        script_args=tuple(args.training_script_args),
        nproc_per_node=args.nproc_per_node,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        master_addr=args.master_addr,
        master_port=args.master_port,
        local_rank_arg=not args.use_env,
    )
    sys.exit(launch(config))


if __name__ == "__main__":
    main()

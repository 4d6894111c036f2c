"""The command line of ``asyncdist-run``, turned into a :class:`LaunchConfig`.

Flags have torchrun's names, both spellings (``--nproc-per-node`` and
``--nproc_per_node``), torchrun's defaults and meanings, the log files
(``--log-dir``, ``--redirects``, ``--tee``) included. torchrun's flags that
asyncdist-run does not implement (its elastic rendezvous, ``--rdzv-backend``,
``--rdzv-endpoint``, ``--rdzv-conf``; ``--start-method``, ...) are refused by
name, with what to use instead (:data:`NOT_IMPLEMENTED`); any other unknown
flag is argparse's usage error. None is silently ignored.

This module parses and validates; it starts nothing and opens no socket.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

from .. import settings
from .._torch import torch_or_none

__all__ = ["LaunchConfig", "build_parser", "config_from_args", "worker_command", "DEFAULT_PREFIX", "NOT_IMPLEMENTED",
           "Streams", "streams_of"]

#: What each output line of a worker starts with (``string.Template`` macros
#: ``${rank}``, ``${local_rank}``, ``${role_name}``, as in torchrun's
#: ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``).
DEFAULT_PREFIX = "[rank ${rank}]: "
PREFIX_ENV = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"


@dataclass(frozen=True, slots=True)
class LaunchConfig:
    """Everything one launcher (one node) needs to run its workers.

    Attributes:
        command: the worker's command line before any ``--local_rank`` argument
            (``[python, script]``, ``[python, -m, module]`` or ``[program]``).
        script_args: passed through after ``command``; ``${local_rank}`` in them
            is replaced by the worker's local rank, as torchrun does.
        master_port: 0 picks a free port (single node only).
        local_rank_arg: pass ``--local_rank=N`` to the worker (the deprecated
            ``asyncdist.launch`` without ``--use_env``).
        local_ranks_filter: local ranks whose output is shown; None shows all.
        shutdown_timeout: seconds between SIGTERM and SIGKILL when stopping workers.
        log_dir: where the workers' log files go (``--log-dir``); None: a fresh
            temporary directory if ``redirects`` or ``tee`` asks for files.
        redirects, tee: which streams of which local ranks go to a log file
            only (``redirects``) or to the file and the console (``tee``); see
            :func:`streams_of`.
        on_failure: ``stop`` (stop every worker when one fails, torchrun's
            way) or ``continue`` (leave the others running).
        replace: with ``continue``, how many replacement workers may be
            started, one per failed worker, to rejoin the job (``ASYNCDIST_JOIN=1``).
    """

    command: tuple[str, ...]
    script_args: tuple[str, ...] = ()
    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    standalone: bool = False
    run_id: str | None = None
    max_restarts: int = 0
    role: str = "default"
    local_rank_arg: bool = False
    prefix_template: str = DEFAULT_PREFIX
    local_ranks_filter: frozenset[int] | None = None
    shutdown_timeout: float = 5.0
    log_dir: str | None = None
    redirects: Streams = ()
    tee: Streams = ()
    on_failure: str = "stop"
    replace: int = 0

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    def global_rank(self, local_rank: int) -> int:
        return self.node_rank * self.nproc_per_node + local_rank


#: torchrun's ``Std`` values: 1 stdout, 2 stderr, 3 both (0 none), per local
#: rank (``(local_rank, mask)``; local rank -1 stands for every local rank).
Streams = tuple[tuple[int, int], ...]


def streams_of(spec: Streams, local_rank: int) -> int:
    """The stream mask (1 stdout, 2 stderr, 3 both) that ``spec`` gives ``local_rank``.

    Example:
        >>> streams_of(((0, 1), (1, 2)), 1)
        2
    """
    mask = 0
    for rank, bits in spec:
        if rank in (-1, local_rank):
            mask = bits
    return mask


def _streams(value: str) -> Streams:
    """torchrun's ``--redirects``/``--tee``: ``3`` (every local rank) or ``0:1,1:2`` (per local rank)."""
    parts = [p.strip() for p in value.split(",") if p.strip()]
    try:
        if len(parts) == 1 and ":" not in parts[0]:
            spec: Streams = ((-1, int(parts[0])),)
        else:
            spec = tuple((int(rank), int(bits)) for rank, _, bits in (p.partition(":") for p in parts))
    except ValueError:
        spec = ((-1, -1),)
    if not spec or any(not 0 <= bits <= 3 or rank < -1 for rank, bits in spec):
        raise argparse.ArgumentTypeError(f"must be 0-3 (1 stdout, 2 stderr, 3 both) or LOCAL_RANK:0-3,..., "
                                         f"not {value!r}")
    return spec


#: torchrun's flags that asyncdist-run does not implement, and what to use instead.
NOT_IMPLEMENTED = {
    "--rdzv-backend": "asyncdist-run's rendezvous is static: give each node --node-rank, and node 0's "
                      "address as --master-addr and --master-port",
    "--rdzv-endpoint": "use --master-addr HOST --master-port PORT (node 0's store)",
    "--rdzv-conf": "asyncdist-run's rendezvous has no options; its timeout is the workers' own "
                   "(init_process_group(timeout=...))",
    "--start-method": "workers are always new processes (a fresh interpreter, like 'spawn'); drop the flag",
    "--monitor-interval": "the launcher sees a worker's exit the moment it happens; drop the flag",
    "--local-addr": "set ASYNCDIST_HOST to the address this node's workers listen on",
    "--logs-specs": "use --log-dir, --redirects and --tee",
    "--run-path": "give the script's path as TRAINING_SCRIPT, or a module with -m",
    "--numa-binding": "bind with numactl or taskset in front of the command (--no-python)",
    "--event-log-handler": "asyncdist-run writes no event log; its messages are on stderr",
    "--signals-to-handle": "asyncdist-run forwards SIGINT, SIGTERM and SIGHUP to the workers",
    "--virtual-local-rank": "not implemented; LOCAL_RANK is the worker's index on this node",
}


class _NotImplemented(argparse.Action):
    """A torchrun flag asyncdist-run refuses: the usage error names it and says what to use."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        name = (option_string or self.dest).replace("_", "-")
        parser.error(f"{option_string} is torchrun's, and asyncdist-run does not implement it: "
                     f"{NOT_IMPLEMENTED[name]}")


def _nproc(value: str) -> int:
    """torchrun's ``--nproc-per-node``: an integer, ``cpu``, ``gpu`` or ``auto``."""
    if value.isdigit():
        return int(value)
    if value == "cpu":
        return os.cpu_count() or 1
    if value in ("gpu", "auto"):
        torch = torch_or_none()  # only these values pay torch's import
        gpus = torch.cuda.device_count() if torch is not None and torch.cuda.is_available() else 0
        if gpus:
            return gpus
        if value == "auto":
            return os.cpu_count() or 1
        raise argparse.ArgumentTypeError("--nproc-per-node=gpu, but no CUDA GPU is visible")
    raise argparse.ArgumentTypeError(f"must be a positive integer, cpu, gpu or auto, not {value!r}")


def _nnodes(value: str) -> int:
    low, _, high = value.partition(":")
    try:
        low_n, high_n = int(low), int(high or low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be N or N:N, not {value!r}") from None
    if low_n != high_n:
        raise argparse.ArgumentTypeError(
            f"{value!r}: a range of nodes needs elastic rendezvous, which asyncdist-run does not do; give one number"
        )
    return low_n


def _ranks(value: str) -> frozenset[int]:
    try:
        return frozenset(int(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated local ranks, not {value!r}") from None


def _names(*names: str) -> tuple[str, ...]:
    """A flag with torchrun's two spellings: ``--a-b`` and ``--a_b``."""
    return tuple(n for name in names for n in dict.fromkeys((name, name.replace("-", "_").replace("__", "--", 1))))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``asyncdist-run`` (what ``--help`` prints)."""
    parser = argparse.ArgumentParser(
        prog="asyncdist-run",
        description="Start NPROC_PER_NODE copies of a Python program on this node with the environment "
        "torch.distributed's env:// rendezvous reads (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, "
        "GROUP_RANK, MASTER_ADDR, MASTER_PORT, ...), serve the job's store on node 0, print every "
        "worker's output with a '[rank N]: ' prefix, and stop all workers when one fails.",
        epilog="Example: asyncdist-run --standalone --nproc-per-node 4 train.py --epochs 3. "
        "Several nodes: run the same command on each with --nnodes, --node-rank, --master-addr and "
        "--master-port, and export the same ASYNCDIST_SECRET everywhere. See docs/launcher.md.",
    )
    add = parser.add_argument
    add(*_names("--nnodes"), type=_nnodes, default=1, help="Number of nodes (N, or N:N; default 1).")
    add(*_names("--nproc-per-node"), type=_nproc, default=1, metavar="NPROC_PER_NODE",
        help="Workers on this node: an integer, 'cpu' (one per CPU), 'gpu' (one per CUDA GPU) or "
        "'auto' (GPUs if any, else CPUs). Default 1.")
    add(*_names("--node-rank"), type=int, default=0, help="This node's index in [0, NNODES) (default 0).")
    add(*_names("--master-addr"), default="127.0.0.1",
        help="Address of node 0, where the launcher serves the job's store (default 127.0.0.1).")
    add(*_names("--master-port"), type=int, default=29500,
        help="Port of the job's store on node 0 (default 29500; 0 picks a free port on a single node).")
    add("--standalone", action="store_true",
        help="Single node: serve the store on 127.0.0.1 on a free port, ignoring --master-addr and "
        "--master-port.")
    add(*_names("--rdzv-id"), default=None, metavar="RDZV_ID",
        help="Job id (TORCHELASTIC_RUN_ID and the id in every connection's handshake); give the same "
        "on every node. Default: ASYNCDIST_JOB_ID if set, else a fresh one on a single node.")
    add(*_names("--max-restarts"), type=int, default=0,
        help="Restart the whole worker group up to this many times after a worker fails (default 0).")
    add("--role", default="default", help="Workers' role name (ROLE_NAME; default 'default').")
    add("-m", "--module", action="store_true",
        help="Run the program as a module, like 'python -m' (TRAINING_SCRIPT is the module name).")
    add(*_names("--no-python"), action="store_true",
        help="Run TRAINING_SCRIPT as an executable, without prepending the Python interpreter.")
    add(*_names("--local-ranks-filter"), type=_ranks, default=None, metavar="RANKS",
        help="Show only these local ranks' output, e.g. 0 or 0,1 (default: all).")
    add(*_names("--log-line-prefix-template"), default=None, metavar="TEMPLATE",
        help="Prefix of each output line, with ${rank}, ${local_rank} and ${role_name} "
        f"(default {PREFIX_ENV} if set, else '{DEFAULT_PREFIX}').")
    add(*_names("--shutdown-timeout"), type=float, default=5.0, metavar="SECONDS",
        help="When stopping workers, seconds between SIGTERM and SIGKILL (default 5).")
    add(*_names("--log-dir"), default=None, metavar="LOG_DIR",
        help="Directory of the workers' log files, LOG_DIR/RUN_ID/attempt_N/LOCAL_RANK/{stdout,stderr}.log, "
        "written when --redirects or --tee asks for them (default: a new temporary directory).")
    add("-r", *_names("--redirects"), type=_streams, default=(), metavar="STD",
        help="Send workers' streams to their log files only: 1 stdout, 2 stderr, 3 both, for every local "
        "rank, or per local rank as 0:3,1:2 (default: none).")
    add("-t", "--tee", type=_streams, default=(), metavar="STD",
        help="Copy workers' streams to their log files as well as the console; values as --redirects.")
    add(*_names("--on-failure"), choices=("stop", "continue"), default="stop",
        help="When a worker fails: 'stop' the others (torchrun's way, the default) or let them 'continue' "
        "(for jobs that survive a lost rank: shrink, then grow; see docs/fault-tolerance.md).")
    add("--replace", type=int, default=0, metavar="N",
        help="With --on-failure continue: start up to N replacement workers, one per failed worker, "
        "that join the running job (ASYNCDIST_JOIN=1) when its ranks call grow_group() (default 0).")
    for flag in NOT_IMPLEMENTED:
        add(*_names(flag), action=_NotImplemented, nargs="?", help=argparse.SUPPRESS)
    add("training_script", metavar="TRAINING_SCRIPT",
        help="The program to run (a .py file, or a module with -m), followed by its own arguments.")
    add("training_script_args", nargs=argparse.REMAINDER, metavar="...",
        help="Arguments passed to every worker unchanged (${local_rank} is replaced by its local rank).")
    return parser


def worker_command(script: str, *, module: bool, no_python: bool) -> tuple[str, ...]:
    """The command line that runs ``script`` the way the flags say."""
    if no_python:
        if module:
            raise ValueError("--no-python and --module cannot be used together")
        return (script,)
    return (sys.executable, "-m", script) if module else (sys.executable, script)


def config_from_args(args: argparse.Namespace) -> LaunchConfig:
    """Validate parsed flags and build the configuration.

    Raises:
        ValueError: flags that contradict each other (the message says which).
    """
    if args.nproc_per_node < 1 or args.nnodes < 1:
        raise ValueError("--nproc-per-node and --nnodes must be at least 1")
    if not 0 <= args.node_rank < args.nnodes:
        raise ValueError(f"--node-rank must be in [0, {args.nnodes}), got {args.node_rank}")
    if args.max_restarts < 0 or args.shutdown_timeout < 0:
        raise ValueError("--max-restarts and --shutdown-timeout must not be negative")
    if args.replace < 0:
        raise ValueError(f"--replace must not be negative, got {args.replace}")
    if args.replace and args.on_failure != "continue":
        raise ValueError("--replace needs --on-failure continue: the replacements join workers that kept running")
    if args.standalone and args.nnodes > 1:
        raise ValueError("--standalone is for a single node; use --master-addr/--master-port with --nnodes > 1")
    if args.master_port == 0 and args.nnodes > 1:
        raise ValueError("--master-port 0 picks a free port on one node; several nodes need a fixed port")
    if not 0 <= args.master_port <= 65535:
        raise ValueError(f"--master-port must be in [0, 65535], got {args.master_port}")
    template = args.log_line_prefix_template
    if template is None:
        template = settings.refresh().environ.get(PREFIX_ENV) or DEFAULT_PREFIX
    return LaunchConfig(
        command=worker_command(args.training_script, module=args.module, no_python=args.no_python),
        script_args=tuple(args.training_script_args),
        nproc_per_node=args.nproc_per_node,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        master_addr="127.0.0.1" if args.standalone else args.master_addr,
        master_port=0 if args.standalone else args.master_port,
        standalone=args.standalone,
        run_id=args.rdzv_id,
        max_restarts=args.max_restarts,
        role=args.role,
        prefix_template=template,
        local_ranks_filter=args.local_ranks_filter,
        shutdown_timeout=args.shutdown_timeout,
        log_dir=args.log_dir,
        redirects=args.redirects,
        tee=args.tee,
        on_failure=args.on_failure,
        replace=args.replace,
    )

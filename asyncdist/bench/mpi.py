"""``--compare mpi``: the same rows on MPI, through mpi4py, as a reference column.

MPI is the bar for small messages on one host (shared memory, well under a
microsecond) and for large collectives. The series runs under ``mpirun``
(``mpirun -n N python -m asyncdist.bench.mpi PLAN OUTDIR``), so the ranks
are MPI's own processes, started by MPI's launcher, with MPI's defaults
(Open MPI: ``--oversubscribe`` so that more ranks than cores run, which
also makes its idle ranks yield). Each rank measures the plan's jobs with
the same timing loop as the blocking series
(:func:`asyncdist.bench.loops.measure_blocking`) through :class:`MpiComm`,
which gives mpi4py's buffer methods torch.distributed's names, and pickles
its samples to ``OUTDIR/rank<r>.pkl`` for the parent.

mpi4py is imported only in the rank processes. :func:`missing` says, in the
parent, why the series cannot run (no mpi4py, no ``mpirun``); the command
line then leaves the column out with that note instead of failing.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .loops import Sample, blocking_jobs
from .plan import Plan

__all__ = ["MpiComm", "missing", "run_mpi", "main"]

_INSTALL = "pip install mpi4py, with an MPI such as Open MPI: apt-get install openmpi-bin libopenmpi-dev"


def missing(dtype: str = "float32") -> str | None:
    """Why the MPI series cannot run here (or None): mpi4py or ``mpirun`` absent, or a dtype NumPy lacks."""
    if importlib.util.find_spec("mpi4py") is None:
        return f"mpi4py is not installed ({_INSTALL})"
    if shutil.which("mpirun") is None:
        return f"mpirun is not on PATH ({_INSTALL})"
    if dtype == "bfloat16":
        return "MPI has no bfloat16 through NumPy buffers"
    return None


def _mpirun(n: int) -> list[str]:
    """The launcher's command line for ``n`` ranks on this host."""
    mpirun = shutil.which("mpirun") or "mpirun"
    version = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30).stdout
    flags = []
    if "Open MPI" in version or "OpenRTE" in version:
        flags = ["--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    return [mpirun, *flags, "-n", str(n)]


def run_mpi(plan: Plan, *, timeout: float) -> list[list[Sample]]:
    """Measure ``plan``'s jobs on ``plan.world_size`` MPI ranks (blocks).

    Returns:
        Each rank's samples, by rank (``per_rank[rank][job]``).

    Raises:
        RuntimeError: ``mpirun`` failed (its output is in the message).
        subprocess.TimeoutExpired: the sweep took longer than ``timeout`` s.
    """
    plan = dataclasses.replace(plan, array="numpy")  # mpi4py reads NumPy buffers without a copy
    with tempfile.TemporaryDirectory(prefix="asyncdist-bench-mpi-") as tmp:
        plan_path = Path(tmp, "plan.pkl")
        plan_path.write_bytes(pickle.dumps(plan))
        command = _mpirun(plan.world_size) + [sys.executable, "-m", "asyncdist.bench.mpi", str(plan_path), tmp]
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} exited with {done.returncode}:\n{done.stdout[-4000:]}")
        return [pickle.loads(Path(tmp, f"rank{rank}.pkl").read_bytes()) for rank in range(plan.world_size)]


class MpiComm:
    """mpi4py's buffer methods under torch.distributed's names, for :mod:`asyncdist.bench.cases`.

    Buffers are NumPy arrays; all calls are blocking, as the facade's.
    """

    class ReduceOp:
        MAX = "max"

    def __init__(self) -> None:
        from mpi4py import MPI

        self._mpi = MPI
        self.comm = MPI.COMM_WORLD

    def all_reduce(self, buf: Any, op: str = "sum") -> None:
        self.comm.Allreduce(self._mpi.IN_PLACE, buf, op=self._mpi.MAX if op == "max" else self._mpi.SUM)

    def broadcast(self, buf: Any, src: int) -> None:
        self.comm.Bcast(buf, root=src)

    def all_gather_single(self, out: Any, mine: Any) -> None:
        self.comm.Allgather(mine, out)

    def reduce_scatter_single(self, mine: Any, whole: Any) -> None:
        self.comm.Reduce_scatter_block(whole, mine)

    def all_to_all_single(self, out: Any, inp: Any) -> None:
        self.comm.Alltoall(inp, out)

    def barrier(self) -> None:
        self.comm.Barrier()

    def send(self, buf: Any, dst: int) -> None:
        self.comm.Send(buf, dest=dst)

    def recv(self, buf: Any, src: int) -> None:
        self.comm.Recv(buf, source=src)


def main(argv: list[str]) -> int:
    """Rank body under ``mpirun``: ``python -m asyncdist.bench.mpi PLAN OUTDIR``."""
    plan: Plan = pickle.loads(Path(argv[0]).read_bytes())
    comm = MpiComm()
    rank = comm.comm.Get_rank()
    samples = blocking_jobs(comm, plan, rank)
    Path(argv[1], f"rank{rank}.pkl").write_bytes(pickle.dumps(samples))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

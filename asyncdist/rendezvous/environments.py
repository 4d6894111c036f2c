"""Where this process sits in the job, as the launcher that started it says.

``env://`` needs a rank and a world size. torchrun and ``asyncdist-run`` set
``RANK`` and ``WORLD_SIZE``; other launchers set their own names, which this
module maps to the same four numbers:

* torchrun, ``asyncdist-run``: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
  ``LOCAL_WORLD_SIZE``;
* Open MPI (``mpirun``): ``OMPI_COMM_WORLD_RANK``, ``OMPI_COMM_WORLD_SIZE``,
  ``OMPI_COMM_WORLD_LOCAL_RANK``, ``OMPI_COMM_WORLD_LOCAL_SIZE``;
* MPICH and Intel MPI (Hydra): ``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID``,
  ``MPI_LOCALNRANKS``;
* SLURM (``srun``): ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, and
  the local size from ``SLURM_TASKS_PER_NODE`` and ``SLURM_NODEID``.

The first launcher whose rank *and* size are both set wins, in this order.
The MPI launchers come before SLURM on purpose: ``mpirun`` inside a SLURM
allocation starts its ranks under daemons that ``srun`` launched, so the
ranks inherit the daemon's ``SLURM_PROCID`` (a node index), and only the MPI
variables are right. None of these launchers sets ``MASTER_ADDR`` or
``MASTER_PORT``: the job script exports them (see ``docs/launcher.md``).

Under a launcher that serves the store itself (``TORCHELASTIC_USE_AGENT_STORE``)
the store outlives a failed attempt, so each attempt's keys live under
``/worker/attempt_{TORCHELASTIC_RESTART_COUNT}``, the prefix torch's env://
handler uses (:class:`AttemptStore`): a restarted worker group starts on a
clean slate instead of finding its ranks already claimed.

The mapping functions only read a mapping; they know nothing of sockets.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from .. import settings
from ..errors import RendezvousError
from .store import PrefixStore, Store

__all__ = ["Placement", "placement", "local_rank_from_env", "LAUNCHER_HINT", "AttemptStore"]


@dataclass(frozen=True, slots=True)
class _Source:
    name: str
    rank: str
    size: str
    local_rank: str
    local_size: str


_SOURCES = (
    _Source("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    _Source("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    _Source("MPICH/Intel MPI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    _Source("SLURM", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", ""),
)

#: For error messages: the variables that can give a rank and a world size.
LAUNCHER_HINT = ", ".join(f"{s.rank}/{s.size}" for s in _SOURCES)


@dataclass(frozen=True, slots=True)
class Placement:
    """This process's place in the job.

    Attributes:
        source: the launcher the numbers came from (``"torchrun"``, ``"Open MPI"``,
            ``"MPICH/Intel MPI"`` or ``"SLURM"``).
        local_rank, local_world_size: None when that launcher did not say.
    """

    source: str
    rank: int
    world_size: int
    local_rank: int | None
    local_world_size: int | None


def _int(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name, "")
    if not name or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise RendezvousError(f"{name} must be an integer, got {value!r}") from None


_TASKS = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def _slurm_local_size(environ: Mapping[str, str]) -> int | None:
    """Tasks on this node from ``SLURM_TASKS_PER_NODE`` (e.g. ``"4(x2),3"``) and ``SLURM_NODEID``."""
    spec, node = environ.get("SLURM_TASKS_PER_NODE", ""), _int(environ, "SLURM_NODEID")
    if not spec or node is None:
        return None
    counts: list[int] = []
    for part in spec.split(","):
        match = _TASKS.match(part.strip())
        if match is None:
            return None  # a format we do not know: say nothing rather than guess
        counts += [int(match[1])] * int(match[2] or 1)
    return counts[node] if 0 <= node < len(counts) else None


def placement(environ: Mapping[str, str] | None = None) -> Placement | None:
    """The rank and world size a launcher set, or None if no launcher did.

    Raises:
        RendezvousError: a variable of the chosen launcher is not an integer.

    Example:
        >>> placement({"SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1"})
        Placement(source='SLURM', rank=3, world_size=8, local_rank=1, local_world_size=None)
    """
    environ = settings.current().environ if environ is None else environ
    for source in _SOURCES:
        rank, size = _int(environ, source.rank), _int(environ, source.size)
        if rank is None or size is None:
            continue
        local_size = _int(environ, source.local_size) if source.local_size else _slurm_local_size(environ)
        return Placement(source.name, rank, size, _int(environ, source.local_rank), local_size)
    return None


def local_rank_from_env(environ: Mapping[str, str] | None = None) -> int | None:
    """This process's rank on its node: ``LOCAL_RANK`` or a launcher's equivalent.

    Looks at ``LOCAL_RANK``, ``OMPI_COMM_WORLD_LOCAL_RANK``, ``MPI_LOCALRANKID``
    and ``SLURM_LOCALID``, in that order; None when none is set.

    Raises:
        RendezvousError: the variable found is not an integer.
    """
    environ = settings.current().environ if environ is None else environ
    for source in _SOURCES:
        value = _int(environ, source.local_rank)
        if value is not None:
            return value
    return None


class AttemptStore(PrefixStore):
    """The launcher's store, scoped to this restart attempt; closing it closes ``store``.

    Args:
        store: the connection to the store the launcher serves (owned from now on).
        environ: where ``TORCHELASTIC_RESTART_COUNT`` is read (0 when unset).
    """

    def __init__(self, store: Store, environ: Mapping[str, str] | None = None) -> None:
        environ = settings.current().environ if environ is None else environ
        attempt = _int(environ, "TORCHELASTIC_RESTART_COUNT") or 0
        super().__init__(f"/worker/attempt_{attempt}", store)

    @property
    def host(self) -> str | None:
        """The underlying store's host (what ``advertise_host`` looks at)."""
        return getattr(self.underlying_store, "host", None)

    def _close(self) -> None:
        self.underlying_store.close()

"""torch.distributed's constants, enums and option classes, as asyncdist serves them.

The names a script written for torch.distributed reaches for besides the
calls themselves: ``Backend`` (and ``Backend.GLOO``), ``BackendConfig``,
the ``is_*_available`` checks, ``default_pg_timeout``, ``DebugLevel`` and
its getters, the ``*Options`` records of torch's ProcessGroup API,
``GroupName``, ``RankType`` and the deprecated ``reduce_op``.

They describe what *asyncdist* does, not what torch's build has: asyncdist
runs every backend name it accepts itself (:mod:`asyncdist.facade.backends`),
so ``is_gloo_available()`` is True without gloo, and ``is_nccl_available()``
says whether NCCL through CuPy can run. Pure values and lookups: no I/O,
nothing imported on import (CuPy's presence is looked up, never imported).
"""

from __future__ import annotations

import enum
import importlib.util
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, ClassVar, NewType

from .. import settings
from ..errors import InvalidArgumentError
from ..reduce.op import ReduceOp
from .backends import parse_backend

__all__ = [
    "Backend",
    "BackendConfig",
    "DebugLevel",
    "GroupName",
    "RankType",
    "default_pg_timeout",
    "get_debug_level",
    "set_debug_level",
    "set_debug_level_from_env",
    "get_default_backend_for_device",
    "is_backend_available",
    "is_gloo_available",
    "is_nccl_available",
    "is_mpi_available",
    "is_ucc_available",
    "is_xccl_available",
    "reduce_op",
    "AllreduceOptions",
    "AllreduceCoalescedOptions",
    "AllToAllOptions",
    "BarrierOptions",
    "BroadcastOptions",
    "GatherOptions",
    "ReduceOptions",
    "ReduceScatterOptions",
    "ScatterOptions",
]

#: torch's default bound on init and on every operation of a group (30 minutes).
default_pg_timeout = timedelta(minutes=30)

#: A group's name (torch's ``NewType``).
GroupName = NewType("GroupName", str)

#: What a rank is (torch: ``int | torch.SymInt``; asyncdist has no symbolic ints).
RankType = int


class Backend(str):
    """torch's enum-like backend names: ``Backend("GLOO") == Backend.GLOO == "gloo"``.

    Calling it lower-cases a name, as torch's does, and keeps names it does
    not know (torch checks them in ``init_process_group``, asyncdist in
    :func:`~asyncdist.facade.backends.parse_backend`).
    """

    UNDEFINED: ClassVar[str] = "undefined"
    GLOO: ClassVar[str] = "gloo"
    NCCL: ClassVar[str] = "nccl"
    UCC: ClassVar[str] = "ucc"
    MPI: ClassVar[str] = "mpi"
    XCCL: ClassVar[str] = "xccl"
    FAKE: ClassVar[str] = "fake"
    ASYNCDIST: ClassVar[str] = "asyncdist"

    backend_list: ClassVar[list[str]] = [UNDEFINED, GLOO, NCCL, XCCL, UCC, MPI, FAKE, ASYNCDIST]
    #: The backend of each device when none is named (asyncdist runs "gloo" itself).
    default_device_backend_map: ClassVar[dict[str, str]] = {"cpu": GLOO, "cuda": NCCL}
    #: The devices each backend name serves in asyncdist.
    backend_capability: ClassVar[dict[str, list[str]]] = {
        GLOO: ["cpu", "cuda"],
        NCCL: ["cuda"],
        ASYNCDIST: ["cpu", "cuda"],
    }

    def __new__(cls, name: str) -> Backend:
        if not isinstance(name, str):
            raise ValueError("Backend constructor parameter must be string-ish")
        value = getattr(Backend, name.upper(), Backend.UNDEFINED)
        # torch's Backend is a str factory: unknown names come back as plain lower-case strings.
        return value if value != Backend.UNDEFINED else name.lower()  # type: ignore[return-value]  # a plain str for an unknown name, as torch returns

    @classmethod
    def register_backend(cls, name: str, func: Any, extended_api: bool = False, devices: str | list[str] | None = None) -> None:
        """Refused: asyncdist runs its own backend for every name it accepts.

        Raises:
            InvalidArgumentError: always; register third-party backends with
                ``torch.distributed.Backend.register_backend`` and use torch.distributed.
        """
        raise InvalidArgumentError(
            f"Backend.register_backend({name!r}): asyncdist runs its own backend for every name it accepts "
            "(None, 'gloo', 'asyncdist', 'nccl'); register third-party backends with torch.distributed"
        )


class BackendConfig:
    """The device → backend map of a backend name (torch's ``BackendConfig``).

    Example:
        >>> str(BackendConfig("cpu:gloo,cuda:nccl")), BackendConfig("gloo").get_device_backend_map()
        ('cpu:gloo,cuda:nccl', {'cpu': 'gloo', 'cuda': 'gloo'})
    """

    def __init__(self, backend: str) -> None:
        name = str(backend).lower()
        if name == Backend.UNDEFINED:
            name = Backend.ASYNCDIST
        spec = parse_backend(name)  # raises for a name asyncdist does not serve
        if ":" in name:
            self.device_backend_map = {d.strip(): v for d, _, v in (p.partition(":") for p in spec.name.split(","))}
        else:
            self.device_backend_map = dict.fromkeys(Backend.backend_capability[name], name)

    def get_device_backend_map(self) -> dict[str, str]:
        """The backend name of each device type."""
        return dict(self.device_backend_map)

    def __repr__(self) -> str:
        return ",".join(f"{device}:{backend}" for device, backend in self.device_backend_map.items())


def get_default_backend_for_device(device: Any) -> str:
    """The backend name a device gets when none is given ("gloo" for "cpu").

    Args:
        device: a device type or name ("cpu", "cuda:1") or a ``torch.device``.

    Raises:
        ValueError: no default backend for that device type.
    """
    kind = getattr(device, "type", None) or str(device).partition(":")[0]
    backend = Backend.default_device_backend_map.get(kind)
    if backend is None:
        raise ValueError(f"Default backend not registered for device : {device}")
    return backend


def is_backend_available(backend: str) -> bool:
    """Whether asyncdist can run ``backend`` ("gloo", "cpu:gloo,cuda:nccl", ...) here."""
    try:
        spec = parse_backend(backend)
    except InvalidArgumentError:
        return False
    return spec.cuda != "nccl" or is_nccl_available()


def is_gloo_available() -> bool:
    """True: asyncdist runs the "gloo" name itself, on its own transport."""
    return True


def is_nccl_available() -> bool:
    """Whether the "nccl" backend can run: NCCL through CuPy needs CuPy (looked up, not imported)."""
    return importlib.util.find_spec("cupy") is not None


def is_mpi_available() -> bool:
    """False: asyncdist does not run the "mpi" backend (it runs under mpirun with any other)."""
    return False


def is_ucc_available() -> bool:
    """False: asyncdist does not run the "ucc" backend."""
    return False


def is_xccl_available() -> bool:
    """False: asyncdist does not run the "xccl" backend (Intel GPUs)."""
    return False


class DebugLevel(enum.Enum):
    """torch's ``TORCH_DISTRIBUTED_DEBUG`` levels. asyncdist's checks (mismatched
    collectives, the flight recorder) are always on, whatever the level."""

    OFF = 0
    INFO = 1
    DETAIL = 2


class _Debug:
    level = DebugLevel.OFF


def get_debug_level() -> DebugLevel:
    """The level last set (by :func:`set_debug_level` or from the environment)."""
    return _Debug.level


def set_debug_level(level: DebugLevel) -> None:
    """Set the level :func:`get_debug_level` reports."""
    if not isinstance(level, DebugLevel):
        raise InvalidArgumentError(f"set_debug_level: expected a DebugLevel, got {level!r}")
    _Debug.level = level


def set_debug_level_from_env() -> None:
    """Read ``TORCH_DISTRIBUTED_DEBUG`` (OFF, INFO or DETAIL; unset: OFF).

    Raises:
        ValueError: any other value, as torch's does.
    """
    value = settings.refresh().environ.get("TORCH_DISTRIBUTED_DEBUG", "OFF").upper()
    if value not in DebugLevel.__members__:
        raise ValueError(
            f"The value of TORCH_DISTRIBUTED_DEBUG must be OFF, INFO, or DETAIL, but it is set to {value!r}"
        )
    _Debug.level = DebugLevel[value]


# -- torch's ProcessGroup option records ------------------------------------------
#
# torch's C++ ProcessGroup API takes these; asyncdist's ProcessGroup does not,
# but code that builds them (custom backends, tests) runs unchanged. Field
# names and defaults are torch's; a timeout of -1 ms is torch's "the group's".

_GROUP_TIMEOUT = timedelta(milliseconds=-1)


def _timeout() -> timedelta:
    return _GROUP_TIMEOUT


@dataclass
class AllreduceOptions:
    reduceOp: Any = field(default_factory=lambda: ReduceOp(ReduceOp.SUM))  # noqa: N815 (torch's names)
    timeout: timedelta = field(default_factory=_timeout)
    asyncOp: bool = True  # noqa: N815


@dataclass
class AllreduceCoalescedOptions(AllreduceOptions):
    pass


@dataclass
class ReduceOptions:
    reduceOp: Any = field(default_factory=lambda: ReduceOp(ReduceOp.SUM))  # noqa: N815
    rootRank: int = 0  # noqa: N815
    rootTensor: int = 0  # noqa: N815
    timeout: timedelta = field(default_factory=_timeout)
    asyncOp: bool = True  # noqa: N815


@dataclass
class ReduceScatterOptions:
    reduceOp: Any = field(default_factory=lambda: ReduceOp(ReduceOp.SUM))  # noqa: N815
    timeout: timedelta = field(default_factory=_timeout)
    asyncOp: bool = True  # noqa: N815


@dataclass
class BroadcastOptions:
    rootRank: int = 0  # noqa: N815
    rootTensor: int = 0  # noqa: N815
    timeout: timedelta = field(default_factory=_timeout)
    asyncOp: bool = True  # noqa: N815


@dataclass
class GatherOptions:
    rootRank: int = 0  # noqa: N815
    timeout: timedelta = field(default_factory=_timeout)
    asyncOp: bool = True  # noqa: N815


@dataclass
class ScatterOptions(GatherOptions):
    pass


@dataclass
class AllToAllOptions:
    timeout: timedelta = field(default_factory=_timeout)
    asyncOp: bool = True  # noqa: N815


@dataclass
class BarrierOptions:
    device_ids: list = field(default_factory=list)
    device: Any = None
    timeout: timedelta = field(default_factory=_timeout)
    asyncOp: bool = True  # noqa: N815


class _DeprecatedReduceOp:
    """torch's deprecated ``reduce_op`` (use :class:`ReduceOp`): SUM, PRODUCT, MIN, MAX."""

    def __getattr__(self, name: str) -> Any:
        if name in ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"):
            return getattr(ReduceOp, name)
        raise AttributeError(name)


reduce_op = _DeprecatedReduceOp()

"""Every environment variable asyncdist reads, declared once, read into one frozen object.

asyncdist's own variables (``ASYNCDIST_*``) are fields of :class:`Settings`,
each declared with its parser, default, unit and meaning; a bad value raises
:class:`~asyncdist.errors.ConfigurationError` naming the variable, the value
and what was expected. The launchers' variables (torchrun's, Open MPI's,
Hydra's, SLURM's, torch's) are declared in :data:`LAUNCHER_VARIABLES` and
kept as text in :attr:`Settings.environ`: the rendezvous reads them as a
family (the first launcher that gives a rank and a size wins), so they are
interpreted there, not here.

A process reads its settings once (:func:`current`, cached) and again where
it starts something that a variable set just before should reach
(:func:`refresh`): ``init_world``, ``init_process_group``, a ``TCPStore``,
a ``LoopThread``, the launcher, and the torch functions that read the
environment at each call. ``docs/configuration.md``'s tables are this
module's declarations (``python -m asyncdist.configuration``; a test
compares them). No other module of the package reads ``os.environ``, except
to build the environment of a process it starts.

Sits below every layer: it imports only :mod:`asyncdist.errors`.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping

from .errors import ConfigurationError

__all__ = ["Variable", "LauncherVariables", "Settings", "LAUNCHER_VARIABLES", "VARIABLES", "current", "refresh",
           "markdown", "name_of", "SECRET_ENV", "JOB_ID_ENV", "JOIN_ENV"]


@dataclass(frozen=True)
class Variable:
    """One of asyncdist's own variables: a field of :class:`Settings`.

    Attributes:
        name: the variable. parse: ``(name, text) -> value`` for a set, non-blank
            value (stripped); raises ConfigurationError. default: the value when
            unset or blank (None: the reader computes it, as ``default_doc`` says).
        unit, doc, read_by, default_doc: the row of ``docs/configuration.md``.
    """

    name: str
    parse: Callable[[str, str], Any]
    default: Any
    default_doc: str
    unit: str
    read_by: str
    doc: str


@dataclass(frozen=True)
class LauncherVariables:
    """Launchers' variables read as a family by the rendezvous (kept as text)."""

    names: tuple[str, ...]
    read_by: str
    doc: str
    default_doc: str
    unit: str


def _bad(name: str, text: str, expected: str) -> ConfigurationError:
    return ConfigurationError(f"{name} must be {expected}, got {text!r}")


def _text(name: str, text: str) -> str:
    return text


def _number(expected: str) -> Callable[[str, str], float]:
    """Any float (the reader checks the range, naming the variable)."""
    def parse(name: str, text: str) -> float:
        try:
            return float(text)
        except ValueError:
            raise _bad(name, text, expected) from None
    return parse


def _seconds(*, finite: bool) -> Callable[[str, str], float]:
    """Seconds >= 0 (``0`` usually: off); ``finite``: refuse ``inf`` too."""
    def parse(name: str, text: str) -> float:
        try:
            seconds = float(text)
        except ValueError:
            seconds = -1.0
        if not seconds >= 0 or (finite and math.isinf(seconds)):
            raise _bad(name, text, "a number of seconds >= 0")
        return seconds
    return parse


def _microseconds(name: str, text: str) -> float:
    """Microseconds, as seconds (a negative number counts as 0)."""
    return max(0.0, _number("a number of microseconds")(name, text)) / 1e6


def _whole(expected: str) -> Callable[[str, str], int]:
    def parse(name: str, text: str) -> int:
        if not text.isdigit():
            raise _bad(name, text, expected)
        return int(text)
    return parse


def _bytes(name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise _bad(name, text, "a number of bytes") from None


def _ring_bytes(name: str, text: str) -> int:
    value = int(text) if text.isdigit() else 0
    if value < 4096 or value & (value - 1):
        raise _bad(name, text, "a power of two of at least 4096 bytes")
    return value


def _switch(name: str, text: str) -> bool:
    """On unless ``0``, ``false``, ``off`` or ``no``."""
    return text.lower() not in ("0", "false", "off", "no")


def _flag(name: str, text: str) -> bool:
    """Off unless ``1`` or ``true``."""
    return text.lower() in ("1", "true")


def _choice(*options: str) -> Callable[[str, str], str]:
    def parse(name: str, text: str) -> str:
        if text.lower() not in options:
            raise _bad(name, text, " or ".join(repr(o) for o in options))
        return text.lower()
    return parse


def _declare(name: str, parse: Callable[[str, str], Any], default: Any, default_doc: str, unit: str, read_by: str,
             doc: str) -> Any:
    """A field of :class:`Settings` read from ``name`` (typed by its annotation)."""
    variable = Variable(name, parse, default, default_doc, unit, read_by, doc)
    return field(default=default, metadata={"variable": variable})


@dataclass(frozen=True)
class Settings:
    """This process's configuration from the environment (immutable; see the module doc).

    Each field but ``environ`` is one variable: its value, or its default when unset or blank.
    ``environ``: the declared variables that are set (asyncdist's and the launchers'), as text.
    """

    secret: str | None = _declare(
        "ASYNCDIST_SECRET", _text, None, "rank 0 makes one and hands it out through the store (authenticated with "
        "this user's key `/tmp/asyncdist-<uid>/store.key` when it listens on loopback)", "text", "rendezvous, stores",
        "the job's shared secret: every connection between ranks, and the store, is authenticated with it "
        "(HMAC-SHA256 over fresh nonces; the secret itself is never sent). Set the same value on every rank to keep "
        "it out of the store.")
    job_id: str | None = _declare(
        "ASYNCDIST_JOB_ID", _text, None, "rank 0 makes one (a UUID)", "text", "rendezvous",
        "the job's identifier, checked in the handshake: a process of another run is refused")
    host: str | None = _declare(
        "ASYNCDIST_HOST", _text, None, "`127.0.0.1` when the master is local, else the address of the interface that "
        "routes to `MASTER_ADDR` (or the `tcp://` host)", "host name or IP address", "rendezvous",
        "the address this rank listens on and tells its peers")
    store_addr: str | None = _declare(
        "ASYNCDIST_STORE_ADDR", _text, None, "unset: the store is at `MASTER_ADDR:MASTER_PORT`", "`host:port`",
        "env://", "where asyncdist's own store is, when a launcher serves torch's store at `MASTER_ADDR:MASTER_PORT` "
        "(set by `asyncdist-run`)")
    agent_store: str | None = _declare(
        "ASYNCDIST_AGENT_STORE", _text, None, "guessed: torch's under torchrun with torch installed, else asyncdist's",
        "`torch` or `asyncdist`", "env://, `asyncdist-run`",
        "which protocol the launcher's store speaks: `torch` or `asyncdist` (for the case the automatic rule gets "
        "wrong, such as a secret exported by hand under torchrun)")
    join: bool = _declare(
        "ASYNCDIST_JOIN", _flag, False, "unset: start a job (or be one of its ranks)", "`1` or unset", "the facade",
        "`1`: `init_process_group` joins the job already running at the rendezvous address (no `RANK` or "
        "`WORLD_SIZE` needed) and returns once its ranks call `grow_group()`, with the next rank "
        "([rejoining](fault-tolerance.md#rejoining)); `asyncdist-run --replace` sets it for its replacements")
    init_report_every: float = _declare(
        "ASYNCDIST_INIT_REPORT_EVERY", _seconds(finite=False), 30.0, "30", "seconds", "rendezvous",
        "a rank still waiting in init logs whom it waits for (to arrive, or to connect) after 10 s (or this "
        "interval, if shorter), then every this many seconds, and node 0's `asyncdist-run` the ranks that have not "
        "joined; `0` turns the lines off ([troubleshooting](troubleshooting.md#the-job-hangs-at-init))")
    heartbeat_interval: float = _declare(
        "ASYNCDIST_HEARTBEAT_INTERVAL", _number("a number of seconds"), 5.0, "5", "seconds", "every rank",
        "time between PINGs on an idle connection; `0` turns the heartbeat off ([reliability](reliability.md))")
    heartbeat_timeout: float = _declare(
        "ASYNCDIST_HEARTBEAT_TIMEOUT", _number("a number of seconds"), 30.0, "30", "seconds", "every rank",
        "a peer that sent nothing for this long is lost (at least twice the interval; `0`: never)")
    trace_buffer: int = _declare(
        "ASYNCDIST_TRACE_BUFFER", _whole("a whole number of operations >= 0"), 2000, "2000", "operations",
        "every rank", "operations the flight recorder keeps per rank (the newest); `0` turns the recorder off, and "
        "with it the counters of operations and the hang warning's answers ([debugging](debugging.md))")
    trace_dir: str | None = _declare(
        "ASYNCDIST_TRACE_DIR", _text, None, "unset: failures dump nothing (SIGUSR1 and `dump_trace()` write to a new "
        "temporary folder); under `asyncdist-run`: `LOG_DIR/RUN_ID/attempt_N/trace`", "folder",
        "every rank, `asyncdist-run`", "where each rank writes its flight-recorder dump "
        "(`asyncdist-trace-rank<R>.json`, every thread's stack included) on an operation timeout, a lost peer, a "
        "collective mismatch, SIGUSR1, a peer's hang warning or a peer's failed call, "
        "and where `dist.dump_trace()` writes by default; `asyncdist-run` sets it for its workers")
    hang_warn: float = _declare(
        "ASYNCDIST_HANG_WARN", _seconds(finite=True), 60.0, "60", "seconds", "every rank",
        "a collective call that has waited this long asks the ranks it waits for where they are and logs one "
        "warning naming them; `0` turns it off")
    loop: str | None = _declare(
        "ASYNCDIST_LOOP", _choice("asyncio", "uvloop"), None, "`asyncio` for the facade", "`asyncio` or `uvloop`",
        "the facade", "`uvloop` makes the facade's event loop uvloop's; the await API runs on the loop you start")
    caller_runs_loop: bool = _declare(
        "ASYNCDIST_CALLER_RUNS_LOOP", _switch, True, "`1`", "`0` or `1`", "the facade",
        "`0` hands every blocking call to the loop thread, instead of running the loop in the calling thread when "
        "it is free")
    spin: float | None = _declare(
        "ASYNCDIST_SPIN_US", _microseconds, None, "1000 when the ranks on this host (`LOCAL_WORLD_SIZE`) are no more "
        "than its cores, else 0", "microseconds", "the facade, the shared-memory rings",
        "how long a blocking call spins for its data before it sleeps, and how long a rank keeps polling its "
        "shared-memory rings after the last traffic (yielding the core between looks); `0`: never spin, and offer "
        "no rings (peers' rings are still written)")
    cma: bool = _declare(
        "ASYNCDIST_CMA", _switch, True, "on where the system call exists", "`0` or `1`", "transport",
        "`0` turns off the reading of same-host payloads from the sender's memory (cross-memory attach)")
    cma_min_bytes: int = _declare(
        "ASYNCDIST_CMA_MIN_BYTES", _bytes, 512 << 10, "524288 (512 KiB)", "bytes", "transport",
        "same-host payloads from this size go by memory; smaller ones inline on the socket")
    shm: bool = _declare(
        "ASYNCDIST_SHM", _switch, True, "on on Linux x86-64", "`0` or `1`", "transport",
        "`0` turns off the shared-memory rings between ranks on one host (frames then go over the loopback socket); "
        "a rank with them off refuses its peers' rings")
    shm_ring_bytes: int | None = _declare(
        "ASYNCDIST_SHM_RING_BYTES", _ring_bytes, None, "1048576 (1 MiB), less in jobs of more than 9 ranks (8 MiB of "
        "rings per rank, at least 16 KiB each)", "bytes, a power of two, at least 4096", "transport",
        "capacity of the ring each rank offers each peer on its host (memory is taken as it is first written, at "
        "most this much per ordered pair of ranks)")
    scratch_keep_bytes: int = _declare(
        "ASYNCDIST_SCRATCH_KEEP_BYTES", _bytes, 256 << 20, "268435456 (256 MiB)", "bytes", "buffers",
        "idle scratch memory the process keeps for reuse")
    pinned_pool_bytes: int = _declare(
        "ASYNCDIST_PINNED_POOL_BYTES", _bytes, 1 << 30, "1073741824 (1 GiB)", "bytes", "gpu",
        "idle pinned host memory kept per device adapter ([GPU](gpu.md))")
    faults: str | None = _declare(
        "ASYNCDIST_FAULTS", _text, None, "unset: no faults", "a fault plan", "testing",
        "the fault plan a rank process of `asyncdist.testing.spawn` installs before it runs (set by "
        "`spawn(..., faults=...)`; [Testing](testing.md))")
    seed: int | None = _declare(
        "ASYNCDIST_SEED", _whole("a whole number >= 0"), None, "unset: each test's own", "a whole number",
        "testing", "the seed of the pytest plugin's fault plans, as `--asyncdist-seed` ([Testing](testing.md))")
    environ: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Settings:
        """The settings that ``environ`` gives (``os.environ``, or a mapping of a test's).

        Raises:
            ConfigurationError: a variable's value is not what it must be.
        """
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            variable = f.metadata.get("variable")
            if variable is not None:
                raw = environ.get(variable.name, "")
                text = raw if variable.parse is _text else raw.strip()  # text is kept as given
                values[f.name] = variable.parse(variable.name, text) if raw.strip() else variable.default
        known = [v.name for v in VARIABLES] + [n for family in LAUNCHER_VARIABLES for n in family.names]
        values["environ"] = MappingProxyType({name: environ[name] for name in known if name in environ})
        return cls(**values)


#: The launchers' variables, in the rows of ``docs/configuration.md``.
LAUNCHER_VARIABLES: tuple[LauncherVariables, ...] = (
    LauncherVariables(("MASTER_ADDR",), "env://", "host of the rendezvous store; required on every rank, rank 0 "
                      "included", "none: required", "host name or IP address"),
    LauncherVariables(("MASTER_PORT",), "env://", "port of the rendezvous store; rank 0 serves it unless a launcher "
                      "does", "none: required", "TCP port"),
    LauncherVariables(("RANK",), "env://", "this process's rank, unless given as an argument",
                      "none: required (or a launcher's below)", "integer"),
    LauncherVariables(("WORLD_SIZE",), "env://", "the number of ranks, unless given as an argument",
                      "none: required (or a launcher's below)", "integer"),
    LauncherVariables(("LOCAL_RANK",), "`get_node_local_rank()`, GPU", "this process's rank on its node; set by "
                      "launchers", "none", "integer"),
    LauncherVariables(("LOCAL_WORLD_SIZE",), "the facade", "the number of ranks on this node (whether to spin, "
                      "above); set by launchers", "none", "integer"),
    LauncherVariables(("TORCHELASTIC_USE_AGENT_STORE",), "env://", "`True` or `1`: the launcher already serves the "
                      "store at `MASTER_ADDR:MASTER_PORT`, so every rank, rank 0 included, is a client",
                      "unset: rank 0 serves it", "`True`/`1` or unset"),
    LauncherVariables(("TORCHELASTIC_RESTART_COUNT",), "env://, torch backend", "the launcher's restart attempt: keys "
                      "go under `/worker/attempt_{N}`, so a restarted attempt starts clean", "0", "integer"),
    LauncherVariables(("TORCHELASTIC_RUN_ID",), "`is_torchelastic_launched()`, env://", "set by torchelastic-style "
                      "launchers (torchrun, `asyncdist-run`)", "unset", "text"),
    LauncherVariables(("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE",), "`asyncdist-run`", "the default of "
                      "`--log-line-prefix-template`", "`[rank ${rank}]: `", "template"),
    LauncherVariables(("TORCH_DISTRIBUTED_DEBUG",), "`set_debug_level_from_env()`", "torch's debug level "
                      "(`get_debug_level()`)", "`OFF`", "`OFF`, `INFO` or `DETAIL`"),
    LauncherVariables(("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), "env://", "rank and size under Open MPI's "
                      "`mpirun`, when `RANK`/`WORLD_SIZE` are unset", "unset", "integer"),
    LauncherVariables(("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"), "env://", "rank on the node and "
                      "ranks per node under Open MPI", "unset", "integer"),
    LauncherVariables(("PMI_RANK", "PMI_SIZE"), "env://", "rank and size under MPICH and Intel MPI (Hydra)", "unset",
                      "integer"),
    LauncherVariables(("MPI_LOCALRANKID", "MPI_LOCALNRANKS"), "env://", "rank on the node and ranks per node under "
                      "Hydra", "unset", "integer"),
    LauncherVariables(("SLURM_PROCID", "SLURM_NTASKS"), "env://", "rank and size under `srun`", "unset", "integer"),
    LauncherVariables(("SLURM_LOCALID", "SLURM_TASKS_PER_NODE", "SLURM_NODEID"), "env://", "rank on the node and "
                      "(from the tasks per node and the node's index) ranks per node under `srun`", "unset",
                      "integer; `4(x2),3`"),
)

#: asyncdist's own variables, in the order of :class:`Settings`' fields.
VARIABLES: tuple[Variable, ...] = tuple(f.metadata["variable"] for f in dataclasses.fields(Settings)
                                        if "variable" in f.metadata)



def name_of(field_name: str) -> str:
    """The variable that :class:`Settings`' field ``field_name`` is read from."""
    return Settings.__dataclass_fields__[field_name].metadata["variable"].name


SECRET_ENV = name_of("secret")
JOB_ID_ENV = name_of("job_id")
JOIN_ENV = name_of("join")

_current: Settings | None = None


def current() -> Settings:
    """The settings as this process last read them (read now if never; any thread).

    Raises:
        ConfigurationError: on the first read, a variable's value is bad.
    """
    return _current if _current is not None else refresh()


def refresh() -> Settings:
    """Read the environment again, and make that :func:`current` (any thread).

    Raises:
        ConfigurationError: a variable's value is bad (the settings read before stay current).
    """
    global _current
    _current = Settings.from_environ(os.environ)
    return _current


def markdown() -> str:
    """``docs/configuration.md``'s two tables of variables, with their headings."""
    head = "| variable | read by | meaning | default | unit |\n|---|---|---|---|---|\n"
    own = "".join(f"| `{v.name}` | {v.read_by} | {v.doc} | {v.default_doc} | {v.unit} |\n" for v in VARIABLES)
    theirs = "".join(f"| {', '.join(f'`{n}`' for n in family.names)} | {family.read_by} | {family.doc} | "
                     f"{family.default_doc} | {family.unit} |\n" for family in LAUNCHER_VARIABLES)
    return f"## asyncdist's own\n\n{head}{own}\n## torch-compatible and launchers'\n\n{head}{theirs}"


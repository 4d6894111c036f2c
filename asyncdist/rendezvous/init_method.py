"""``init_method`` URLs and the environment, turned into a store, rank and size.

The forms torch.distributed accepts, with its meaning:

* ``env://`` (the default): ``MASTER_ADDR``, ``MASTER_PORT`` and, unless given
  as arguments, ``RANK`` and ``WORLD_SIZE`` (or the rank and size that
  ``srun`` or ``mpirun`` set, see :mod:`.launchers`); rank 0 serves a TCPStore
  at ``MASTER_ADDR:MASTER_PORT``, the others connect to it. Under a launcher
  that serves the store itself (``TORCHELASTIC_USE_AGENT_STORE=True``), every
  rank is a client, under the restart attempt's key prefix. When
  ``ASYNCDIST_STORE_ADDR=host:port`` is set (``asyncdist-run`` sets it when it
  serves torch's store at ``MASTER_ADDR:MASTER_PORT`` for torch scripts), the
  ranks join asyncdist's own, authenticated store there instead, as clients,
  under the attempt's prefix; ``MASTER_ADDR``/``MASTER_PORT`` are not read.
* ``tcp://host:port``: the same store, with rank and world size as arguments.
* ``file:///path``: a :class:`FileStore` on a shared file system.
* ``store=``: a store the caller made; rank and world size are required.

``?rank=`` and ``?world_size=`` in the URL are honoured as in torch. Blocking
(it may construct a TCPStore): call it off the event loop.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping
from urllib.parse import parse_qs, urlparse

from .. import settings
from ..settings import SECRET_ENV
from ..errors import InvalidArgumentError, InvalidRankError, RendezvousError, StoreError
from .file_store import FileStore
from .environments import LAUNCHER_HINT, AttemptStore, placement
from .local_key import local_key, local_key_path
from .store import Store
from .tcp_store import TCPStore
from .waiting import WaitReports, until_listening
from .torch_store import AGENT_STORE_KIND_ENV, agent_store_is_torchs, torch_store_client

__all__ = ["Plan", "resolve", "HOST_ENV", "AGENT_STORE_ENV", "STORE_ADDR_ENV", "store_address", "parse_store_address"]

HOST_ENV = settings.name_of("host")
AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"
#: ``host:port`` (``[v6]:port``) of asyncdist's store served by the launcher;
#: when set, env:// prefers it to ``MASTER_ADDR:MASTER_PORT`` (which then
#: belongs to torch's store, for torch scripts).
STORE_ADDR_ENV = settings.name_of("store_addr")
_ENV_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")

logger = logging.getLogger("asyncdist.store")


# How long a process with an impossible rank tries to reach the store to tell
# the other ranks, before it raises its error all the same.
_REFUSAL_CONNECT_SECONDS = 3.0


@dataclass(frozen=True, slots=True)
class Plan:
    """What the rendezvous needs: a store, who we are, and where to listen.

    Attributes:
        owns_store: True when the store was made here and must be closed with the group.
        where: the store's address as users wrote it (``tcp://host:port``,
            ``file:///path``), for the messages of a rank that waits.
        refused: this process's rank is impossible (negative, or not below the
            world size): the caller tells the other ranks through ``store``,
            which they share, and raises this error instead of joining.
    """

    store: Store
    rank: int
    world_size: int
    host: str
    owns_store: bool
    where: str = "the store"
    refused: InvalidRankError | None = None


def _int(value: str, name: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise RendezvousError(f"{name} must be an integer, got {value!r}") from None


def _check_rank(rank: int, world_size: int) -> None:
    if world_size < 1:
        raise InvalidArgumentError(f"world_size must be a positive integer, got {world_size}")
    if rank < 0:
        raise InvalidRankError(f"rank {rank} is negative: it must be in [0, {world_size}) for world_size={world_size}")
    if rank >= world_size:
        raise InvalidRankError(f"rank {rank} is out of range: it must be in [0, {world_size}) for world_size={world_size}")


def _rank_error(rank: int, world_size: int) -> InvalidRankError | None:
    """The error of an impossible rank, which the other ranks can be told of;
    a world size below 1 is raised at once (no rank could be in range)."""
    try:
        _check_rank(rank, world_size)
    except InvalidRankError as exc:
        return exc
    return None


def _check_resolves(host: str, port: int, who: str, what: str) -> None:
    """Fail at once on a host name that does not resolve (the store's client
    would retry it until the timeout); a temporary DNS failure is left to retry.

    Raises:
        RendezvousError: ``host`` is not a known name.
    """
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        if exc.errno == socket.EAI_AGAIN:
            return
        raise RendezvousError(f"{who}: {what} {host!r} does not resolve: {exc.strerror}") from exc


def advertise_host(master: str | None, environ: Mapping[str, str]) -> str:
    """The address this rank listens on and tells its peers.

    ``ASYNCDIST_HOST`` wins; otherwise loopback when the master is local (or
    unknown), else the local address of the interface that reaches the master.
    """
    if environ.get(HOST_ENV):
        return environ[HOST_ENV]
    if master is None or master in ("localhost", ""):
        return "127.0.0.1"
    try:
        address = socket.getaddrinfo(master, None, type=socket.SOCK_STREAM)[0][4][0]
        if ipaddress.ip_address(address).is_loopback:
            return "127.0.0.1"
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((address, 9))  # UDP: no packet is sent
            return probe.getsockname()[0]
    except OSError as exc:
        raise RendezvousError(f"cannot find a local address that reaches the master {master!r}: {exc}") from exc


def store_address(host: str, port: int) -> str:
    """``host:port`` as :data:`STORE_ADDR_ENV` holds it (an IPv6 address in brackets).

    Example:
        >>> store_address("::1", 29400)
        '[::1]:29400'
    """
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_store_address(text: str) -> tuple[str, int]:
    """The host and port of a :data:`STORE_ADDR_ENV` value (``host:port`` or ``[v6]:port``).

    Raises:
        RendezvousError: not of that form, or the port is not in [1, 65535].
    """
    host, sep, port = text.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise RendezvousError(f"{STORE_ADDR_ENV} must be host:port (or [ipv6]:port), got {text!r}")
    return host, int(port)


def _launcher_store(text: str, rank: int, world_size: int, timeout: float, who: str) -> Store:
    """A client of asyncdist's store that a launcher announced in :data:`STORE_ADDR_ENV`."""
    host, port = parse_store_address(text)
    timeout = _reach(host, port, rank, world_size, timeout, who, f" (the launcher's store, {STORE_ADDR_ENV})")
    try:
        return TCPStore(host, port, world_size, is_master=False, timeout=timeout, wait_for_workers=False)
    except StoreError as exc:
        raise RendezvousError(f"{who}: cannot use the launcher's store at {host}:{port} "
                              f"({STORE_ADDR_ENV}): {exc}") from exc


def _reach(host: str, port: int, rank: int, world_size: int, timeout: float, who: str, hint: str = "") -> float:
    """Wait until ``host:port`` accepts a connection, saying so while it does not
    (see :mod:`.waiting`); return the seconds left of ``timeout``.

    The store's client retries by itself but silently; this probe is what makes
    an unreachable store visible.

    Raises:
        RendezvousError: nothing accepted a connection within ``timeout``.
    """
    start = time.monotonic()
    deadline = start + timeout
    reports = WaitReports(rank, world_size, f"tcp://{store_address(host, port)}", start, deadline, who=who)

    def refused(now: float, exc: OSError) -> None:
        if reports.due(now):
            reports.report_unreachable(now, exc)

    try:
        until_listening(host, port, deadline, refused)  # blocking: resolve() runs off the loop
    except OSError as exc:
        where = store_address(host, port)
        raise RendezvousError(f"{who}: cannot use the store at {where}: TCPStore: could not connect "
                              f"to the store at {where} within {timeout:g} s: {exc}{hint}") from exc
    return max(deadline - time.monotonic(), 0.01)


def _is_loopback(host: str) -> bool:
    """True when ``host`` names a loopback address only ("" and 0.0.0.0 are every interface)."""
    if host in ("", "0.0.0.0", "::"):
        return False
    try:
        return all(ipaddress.ip_address(info[4][0]).is_loopback
                   for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM))
    except (OSError, ValueError):
        return False


def _store_secret(host: str, port: int, rank: int, environ: Mapping[str, str]) -> tuple[str | bytes, str]:
    """The secret of asyncdist's store at ``host:port``, and a hint for its errors.

    ``ASYNCDIST_SECRET`` when set. Otherwise, for a store on loopback (every
    rank on this host), this user's key (:mod:`.local_key`), so that no other
    user can read or change the job's keys. Otherwise none, loudly: the job's
    secret will then be published in a store that anyone who reaches the port can read.
    """
    if environ.get(SECRET_ENV):
        return environ[SECRET_ENV], ""
    if _is_loopback(host):
        return local_key(), (f" (without {SECRET_ENV}, the ranks of a job on one host authenticate with this "
                             f"user's key {local_key_path()}: start every rank as the same user on this host, "
                             f"or export the same {SECRET_ENV} on every rank)")
    if rank == 0:
        logger.warning("rank 0: %s is not set and the store at %s:%d listens beyond loopback: anyone who can "
                       "reach that port can read the job's secret and change its keys; export the same %s "
                       "on every rank", SECRET_ENV, host, port, SECRET_ENV)
    return "", ""


def _tcp_store(host: str, port: int, rank: int, world_size: int, timeout: float, environ: Mapping[str, str],
               who: str) -> Store:
    served_by_agent = environ.get(AGENT_STORE_ENV, "").lower() in ("true", "1")
    torchs = served_by_agent and agent_store_is_torchs(environ)  # torchrun's agent: torch's protocol
    hint = f" (if torchrun serves it, set {AGENT_STORE_KIND_ENV}=torch)" if served_by_agent and not torchs else ""
    if rank != 0 or served_by_agent:
        timeout = _reach(host, port, rank, world_size, timeout, who, hint)
    try:
        if torchs:
            return torch_store_client(host, port, timeout)
        secret: str | bytes | None = None  # the agent's store: the secret the launcher gave, if any
        if not served_by_agent:
            secret, hint = _store_secret(host, port, rank, environ)
        return TCPStore(host, port, world_size, is_master=(rank == 0 and not served_by_agent), timeout=timeout,
                        wait_for_workers=False, secret=secret)
    except StoreError as exc:
        raise RendezvousError(f"{who}: cannot use the store at {host}:{port}: {exc}{hint}") from exc


def _refusing(refused: InvalidRankError | None, make: Callable[..., Store], *args: Any) -> Store:
    """``make(*args)``; for a process with an impossible rank, its own error
    when the store cannot be reached either (it only wanted to tell the others)."""
    if refused is None:
        return make(*args)
    try:
        return make(*args)
    except RendezvousError:
        raise refused from None


def resolve(
    init_method: str | None,
    *,
    rank: int = -1,
    world_size: int = -1,
    store: Store | None = None,
    timeout: float,
    environ: Mapping[str, str] | None = None,
    who: str | None = None,
) -> Plan:
    """Work out the store, rank and world size of this process.

    ``who`` names this process in messages (None: ``rank <rank>``; a process
    joining a running job has no rank yet).

    Raises:
        RendezvousError: a required environment variable is missing or bad,
            or the store cannot be reached or served.
        InvalidRankError, InvalidArgumentError: rank or world size out of range.
    """
    environ = settings.current().environ if environ is None else environ  # None: the settings' variables
    if store is not None:
        if init_method is not None:
            raise InvalidArgumentError("init_method and store are mutually exclusive")
        if rank < 0 or world_size < 1:
            raise InvalidArgumentError("rank and world_size must be given when store is given")
        _check_rank(rank, world_size)
        master = getattr(store, "host", None)
        return Plan(store, rank, world_size, advertise_host(master, environ), owns_store=False)

    url = urlparse(init_method or "env://")
    query = {k: v[-1] for k, v in parse_qs(url.query).items()}
    if "rank" in query and rank < 0:
        rank = _int(query["rank"], "rank")
    if "world_size" in query and world_size < 0:
        world_size = _int(query["world_size"], "world_size")

    if url.scheme == "env":
        # RANK/WORLD_SIZE, or what srun / mpirun set instead (see .launchers).
        found = placement(environ) if rank < 0 or world_size < 0 else None
        launcher_store = environ.get(STORE_ADDR_ENV, "").strip()
        needed = [name for name, have in (("RANK", rank >= 0), ("WORLD_SIZE", world_size >= 0)) if not have]
        needed = ([] if launcher_store else ["MASTER_ADDR", "MASTER_PORT"]) + ([] if found else needed)
        missing = [name for name in needed if not environ.get(name)]
        if missing:
            raise RendezvousError(
                f"env:// rendezvous needs the environment variables {', '.join(_ENV_VARS)} "
                f"(or, for rank and world size, one of {LAUNCHER_HINT}); not set: {', '.join(missing)}"
            )
        if rank < 0:
            rank = _int(environ["RANK"], "RANK") if environ.get("RANK") or not found else found.rank
        if world_size < 0:
            world_size = (_int(environ["WORLD_SIZE"], "WORLD_SIZE") if environ.get("WORLD_SIZE") or not found
                          else found.world_size)
        who = who or f"rank {rank}"
        refused = _rank_error(rank, world_size)
        if refused is not None:  # a client for a moment, to tell the others
            timeout = min(timeout, _REFUSAL_CONNECT_SECONDS)
        if launcher_store:  # asyncdist-run's own store, beside torch's at MASTER_ADDR:MASTER_PORT
            attempt = AttemptStore(_refusing(refused, _launcher_store, launcher_store, rank, world_size, timeout, who),
                                   environ)
            return Plan(attempt, rank, world_size, advertise_host(attempt.host, environ), owns_store=True,
                        where=f"tcp://{launcher_store}", refused=refused)
        host, port = environ["MASTER_ADDR"], _int(environ["MASTER_PORT"], "MASTER_PORT")
        _check_resolves(host, port, who, "MASTER_ADDR")
        made = _refusing(refused, _tcp_store, host, port, rank, world_size, timeout, environ, who)
        if environ.get(AGENT_STORE_ENV, "").lower() in ("true", "1"):
            made = AttemptStore(made, environ)  # a restarted group must not see the last attempt's keys
        return Plan(made, rank, world_size, advertise_host(host, environ), owns_store=True,
                    where=f"tcp://{store_address(host, port)}", refused=refused)

    if rank < 0 or world_size < 0:
        raise InvalidArgumentError(f"{url.scheme}:// rendezvous needs rank and world_size (arguments or URL query)")
    who = who or f"rank {rank}"
    if url.scheme == "tcp":
        if not url.hostname or url.port is None:
            raise InvalidArgumentError(f"tcp:// init_method needs host and port, got {init_method!r}")
        refused = _rank_error(rank, world_size)
        if refused is not None:
            timeout = min(timeout, _REFUSAL_CONNECT_SECONDS)
        _check_resolves(url.hostname, url.port, who, "the host of the tcp:// init_method")
        made = _refusing(refused, _tcp_store, url.hostname, url.port, rank, world_size, timeout, environ, who)
        return Plan(made, rank, world_size, advertise_host(url.hostname, environ), owns_store=True,
                    where=f"tcp://{store_address(url.hostname, url.port)}", refused=refused)
    _check_rank(rank, world_size)
    if url.scheme == "file":
        path = url.path if not url.netloc else url.netloc + url.path
        if not path:
            raise InvalidArgumentError(f"file:// init_method needs a path, got {init_method!r}")
        return Plan(FileStore(path, world_size), rank, world_size, advertise_host(None, environ), owns_store=True,
                    where=f"file://{path}")
    raise InvalidArgumentError(f"unsupported init_method {init_method!r}: use env://, tcp://host:port or file:///path")

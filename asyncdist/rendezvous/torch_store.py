"""torch's stores seen as asyncdist's, and which protocol a launcher's store speaks.

Two places hand asyncdist a store that only torch can talk to:

* **torch's backend API.** ``torch.distributed.init_process_group("asyncdist")``
  gives the backend's creator a torch ``Store`` (a ``PrefixStore`` over
  whatever the rendezvous made); :mod:`asyncdist.torch_backend` bootstraps an
  asyncdist world over it.
* **torchrun.** Its agent serves a torch ``TCPStore`` at
  ``MASTER_ADDR:MASTER_PORT`` and tells the workers so
  (``TORCHELASTIC_USE_AGENT_STORE=True``). asyncdist's own ``TCPStore`` speaks
  asyncdist's protocol (msgpack frames, HMAC-authenticated), not torch's, so
  an asyncdist worker joins torchrun's store with torch's own client,
  ``torch.distributed.TCPStore(host, port, is_master=False)``, rather than a
  second implementation of torch's wire protocol: torch's client is the one
  that is sure to match torch's server, in every torch version.

:class:`TorchStore` wraps any object with torch's ``Store`` API in asyncdist's
:class:`~.store.Store` interface. It never imports torch: only
:func:`torch_store_client` and :func:`torch_store_server` do, through
:mod:`asyncdist._torch`. The server is what ``asyncdist-run`` serves at
``MASTER_ADDR:MASTER_PORT`` so that torch scripts' env:// clients find
torch's protocol there, as under torchrun.

Which agent serves the store (:func:`agent_store_is_torchs`):
``ASYNCDIST_AGENT_STORE=torch`` or ``=asyncdist`` says so outright, and
``asyncdist-run`` always sets it (its asyncdist workers use
``ASYNCDIST_STORE_ADDR`` anyway, see :mod:`.init_method`). Otherwise
:func:`asyncdist.testing.spawn` is recognised by the ``ASYNCDIST_SECRET`` /
``ASYNCDIST_JOB_ID`` it gives every worker, which torchrun never sets;
without them, the store is torchrun's if ``TORCHELASTIC_RUN_ID`` is set
(torchrun always sets it) and torch is installed. The explicit variable is
for the case the rule gets wrong: a secret exported by hand under torchrun.
A wrong guess is costly: torch's client and asyncdist's server may wait on
each other without a timeout.

Invariants: torch's errors (``DistStoreError``, ``DistNetworkError``, all
``RuntimeError``) become :class:`~asyncdist.errors.StoreError` here, at the
boundary. ``get`` and ``wait`` poll ``check`` (1 ms, doubling to 50 ms)
instead of calling torch's ``wait`` with a short timeout: the rendezvous waits
in 0.2 s slices, and each torch wait that times out logs two warnings.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import time
from datetime import timedelta
from typing import Any, Callable, Mapping

from .._torch import torch_or_none
from ..errors import RendezvousError, StoreError
from .. import settings
from ..settings import JOB_ID_ENV, SECRET_ENV
from .store import Store

__all__ = [
    "TorchStore", "agent_store_is_torchs", "torch_store_client", "torch_store_server", "listen_on",
    "AGENT_STORE_KIND_ENV", "RUN_ID_ENV",
]

#: ``torch`` or ``asyncdist``: whose protocol the launcher's store speaks.
AGENT_STORE_KIND_ENV = settings.name_of("agent_store")
#: Set by torchrun (and by asyncdist-run) for every worker.
RUN_ID_ENV = "TORCHELASTIC_RUN_ID"

_POLL_FIRST = 0.001  # seconds; a key set by a rank on the same host shows up fast
_POLL_MAX = 0.05  # seconds; bounds the latency a poll adds to one rendezvous step
_BACKLOG = 2048  # connections a served store queues: every worker of a node may connect at once


class TorchStore(Store):
    """asyncdist's :class:`~.store.Store` over a torch ``Store`` (any thread).

    Args:
        store: a ``torch.distributed.Store`` (``TCPStore``, ``FileStore``,
            ``HashStore``, ``PrefixStore``) or anything with its methods.
        owned: closing this store drops ``store`` (a client made for it).

    Example:
        >>> import torch.distributed as tdist
        >>> store = TorchStore(tdist.HashStore())
        >>> store.add("n", 2)
        2
    """

    def __init__(self, store: Any, *, owned: bool = False) -> None:
        super().__init__(store.timeout)
        self._torch: Any = store
        self._owned = owned

    @property
    def torch_store(self) -> Any:
        """The torch store underneath."""
        return self._torch

    @property
    def host(self) -> str | None:
        """The host of the torch ``TCPStore`` at the bottom, if there is one
        (the rendezvous advertises the interface that reaches it)."""
        return self._bottom("host")

    @property
    def port(self) -> int | None:
        """The port of the torch ``TCPStore`` at the bottom, if there is one."""
        return self._bottom("port")

    def _bottom(self, name: str) -> Any:
        """Attribute ``name`` of the first store down the ``PrefixStore`` chain that has it."""
        store = self._torch
        while store is not None:
            value = getattr(store, name, None)
            if value is not None:
                return value
            store = getattr(store, "underlying_store", None)
        return None

    def set_timeout(self, timeout: timedelta | float) -> None:
        super().set_timeout(timeout)
        self._torch.set_timeout(self.timeout)

    def _call(self, op: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except RuntimeError as exc:  # DistStoreError, DistNetworkError
            raise StoreError(f"torch {type(self._torch).__name__}.{op}: {exc}") from exc

    def _poll(self, keys: list[str], timeout: float) -> list[str]:
        """Check ``keys`` until all are set or ``timeout`` s passed; return the missing ones."""
        deadline = time.monotonic() + timeout
        delay = _POLL_FIRST
        while not self._call("check", self._torch.check, keys):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._closed:
                return [k for k in keys if not self._call("check", self._torch.check, [k])]
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, _POLL_MAX)
        return []

    def _set(self, key: str, value: bytes) -> None:
        self._call("set", self._torch.set, key, value)

    def _get(self, key: str, timeout: float) -> bytes | None:
        if self._poll([key], timeout):
            return None
        return self._call("get", self._torch.get, key)

    def _add(self, key: str, amount: int) -> int:
        return self._call("add", self._torch.add, key, amount)

    def _compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        return self._call("compare_set", self._torch.compare_set, key, expected, desired)

    def _wait(self, keys: list[str], timeout: float) -> list[str]:
        return self._poll(keys, timeout)

    def _check(self, keys: list[str]) -> bool:
        return self._call("check", self._torch.check, keys)

    def _delete_key(self, key: str) -> bool:
        return self._call("delete_key", self._torch.delete_key, key)

    def _num_keys(self) -> int:
        return self._call("num_keys", self._torch.num_keys)

    def _close(self) -> None:
        if self._owned:
            self._torch = None  # torch's client closes its socket when it is freed


def agent_store_is_torchs(environ: Mapping[str, str]) -> bool:
    """Whether the launcher's store (``TORCHELASTIC_USE_AGENT_STORE``) is torch's.

    Raises:
        RendezvousError: ``ASYNCDIST_AGENT_STORE`` is neither ``torch`` nor ``asyncdist``.
    """
    kind = environ.get(AGENT_STORE_KIND_ENV, "").strip().lower()
    if kind:
        if kind not in ("torch", "asyncdist"):
            raise RendezvousError(f"{AGENT_STORE_KIND_ENV} must be 'torch' or 'asyncdist', got {kind!r}")
        return kind == "torch"
    if environ.get(SECRET_ENV) or environ.get(JOB_ID_ENV):
        return False  # asyncdist-run's workers (and spawn's) carry these
    if not environ.get(RUN_ID_ENV):
        return False  # torchrun always sets it
    return importlib.util.find_spec("torch") is not None  # without importing it


def torch_store_client(host: str, port: int, timeout: float) -> TorchStore:
    """A client of the torch ``TCPStore`` at ``host:port`` (blocking: it connects).

    Raises:
        StoreError: torch is not installed, or the store is unreachable within
            ``timeout`` seconds.
    """
    torch = torch_or_none()
    if torch is None:
        raise StoreError(f"the store at {host}:{port} is torch's (torchrun), and torch is not installed")
    try:  # ``import torch`` imports torch.distributed too
        client = torch.distributed.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout),
                                wait_for_workers=False)
    except RuntimeError as exc:
        raise StoreError(f"cannot reach torch's TCPStore at {host}:{port}: {exc}") from exc
    return TorchStore(client, owned=True)


def listen_on(bind: str, port: int) -> socket.socket:
    """A listening socket on ``bind:port`` (``""``: every interface, IPv6 too where possible), for
    :func:`torch_store_server`."""
    if bind == "":
        if socket.has_dualstack_ipv6():
            return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=_BACKLOG)
        return socket.create_server(("", port), backlog=_BACKLOG)
    family = socket.getaddrinfo(bind, port, type=socket.SOCK_STREAM)[0][0]
    return socket.create_server((bind, port), family=family, backlog=_BACKLOG)


def torch_store_server(
    host: str, port: int, timeout: float, *, bind: str | None = None, listener: socket.socket | None = None,
) -> TorchStore:
    """Serve a torch ``TCPStore`` on ``port`` (0: a free one), as torchrun's agent does (blocking).

    The server has no authentication, like torchrun's. Closing the returned
    store (the only reference to torch's object) stops the server and frees
    the port.

    Args:
        host: the master's address, where the returned store's own client connects.
        port: the port to bind; read the bound one from ``.port``.
        timeout: seconds, the store's default timeout for its operations.
        bind: the interface to listen on (``""``: every one). None lets torch
            choose, and torch listens on every interface whatever ``host`` is;
            otherwise the socket is bound here (``SO_REUSEADDR``, so the port
            can be served again at once) and handed to torch
            (``master_listen_fd``), which closes it with the server.
        listener: a socket listening already, to serve on instead (``port``
            and ``bind`` unused); torch's server owns it from then on.

    Raises:
        StoreError: torch is not installed, or the port cannot be bound.
    """
    torch = torch_or_none()
    if torch is None:
        raise StoreError("torch is not installed, so torch's TCPStore cannot be served")
    fd = None
    if listener is None and bind is not None:
        try:
            listener = listen_on(bind, port)
        except OSError as exc:
            raise StoreError(f"cannot listen on {bind or '*'}:{port}: {exc}") from exc
    if listener is not None:
        port = listener.getsockname()[1]
        fd = listener.detach()  # torch's server owns it from now on
    try:
        server = torch.distributed.TCPStore(host, port, is_master=True, timeout=timedelta(seconds=timeout),
                                            wait_for_workers=False, master_listen_fd=fd)
    except RuntimeError as exc:  # DistNetworkError: address in use, ...
        if fd is not None:
            os.close(fd)
        raise StoreError(f"torch's TCPStore: {exc}") from exc
    return TorchStore(server, owned=True)

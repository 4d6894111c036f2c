"""The stores a launcher serves on node 0, or joins on the other nodes.

Two kinds of script meet at ``MASTER_ADDR:MASTER_PORT`` with
``TORCHELASTIC_USE_AGENT_STORE=True``, and they speak different protocols:

* **torch scripts** (``init_process_group("gloo")``, or ``"asyncdist"``
  through :mod:`asyncdist.torch_backend`) connect with torch's own
  ``TCPStore`` client, which only torch's server understands;
* **asyncdist scripts** (the facade, the await API) connect with asyncdist's
  client, authenticated with the job's secret.

So when torch is installed the launcher serves both, as two stores (kind
``"torch"``): a torch ``TCPStore`` at ``MASTER_ADDR:MASTER_PORT`` (bound to
``--master-port``, a free port with ``--standalone``), exactly what torchrun's
agent serves, and asyncdist's own store on a free port of its own, announced
to the workers as ``ASYNCDIST_STORE_ADDR=host:port``, which asyncdist's
env:// prefers. Serving torch's store means importing torch, seconds of CPU
that a job of asyncdist scripts would pay for nothing: so on one node the
launcher only listens on ``MASTER_PORT`` and starts torch's server there when
the first client connects (:class:`TorchStoreOnDemand`); a client's
connection waits in the listen queue meanwhile. torch's store has no authentication, as under torchrun;
asyncdist's keeps it. Both bind the master address on one node (torch
alone would listen on every interface) and every interface on several. Without torch, or with ``ASYNCDIST_AGENT_STORE=asyncdist``
in the launcher's environment, asyncdist's store alone is at
``MASTER_ADDR:MASTER_PORT`` (kind ``"asyncdist"``), as before torch scripts
were supported.

Several nodes: only ``--master-port`` is agreed on. Node 0 publishes the
port of asyncdist's store in torch's store (:data:`STORE_PORT_KEY`); the
other launchers read it there, which also makes them wait for node 0, and
then join asyncdist's store, where the launchers' exit barrier runs. Every
node must use the same kind: install torch on all nodes or none, or export
the same ``ASYNCDIST_AGENT_STORE`` everywhere. A forged port in torch's
store cannot redirect the workers while there is a secret: asyncdist's
client requires its server to prove it knows the secret.

Restarts: asyncdist's store outlives a failed attempt, and each attempt
rendezvouses in it under ``/worker/attempt_{TORCHELASTIC_RESTART_COUNT}``.
torch's store cannot be scoped that way: torch 2.13's env:// does not prefix
the attempt, so a restarted gloo group would read the last attempt's
addresses and fail to connect when a rank starts late (torchrun, whose
store persists, fails so too). So before each restart node 0 serves torch's
store afresh, on the same port (:meth:`JobStores.begin_attempt`), once its
own workers are gone; on several nodes it then marks the attempt in
asyncdist's store, and the other launchers wait for that mark before
starting their workers, so that none of them meets the last attempt's
store. Both stores are closed by :meth:`JobStores.close`; closing torch's
stops its server.
"""

from __future__ import annotations

import importlib.util
import os
import select
import socket
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Mapping

from ..errors import StoreError, StoreTimeoutError
from ..rendezvous.init_method import store_address
from ..rendezvous.tcp_store import TCPStore
from ..rendezvous.waiting import FIRST_REPORT_SECONDS, duration, report_every, until_listening
from ..rendezvous.torch_store import (
    AGENT_STORE_KIND_ENV, TorchStore, listen_on, torch_store_client, torch_store_server,
)
from .args import LaunchConfig

__all__ = ["JobStores", "LaunchError", "open_stores", "store_kind", "STORE_PORT_KEY", "ATTEMPT_READY_KEY",
           "JOIN_TIMEOUT"]

#: How long a launcher waits for node 0's store, and node 0 for the others
#: to finish (torchrun's exit barrier waits 300 s too).
JOIN_TIMEOUT = timedelta(seconds=300)
#: Where node 0 publishes the port of asyncdist's store, in torch's store.
STORE_PORT_KEY = "asyncdist-run/asyncdist_store_port"
#: Set in asyncdist's store by node 0 once torch's store is fresh for attempt N (``.../N``).
ATTEMPT_READY_KEY = "asyncdist-run/torch_store_ready"


class LaunchError(Exception):
    """The launcher itself cannot go on (store port taken, master unreachable, ...)."""


class TorchStoreOnDemand:
    """torch's ``TCPStore`` server on a port that listens now, started when first
    needed: when a client connects, or :meth:`server` is called (any thread).

    Args:
        host: the master's address (where the server's own client connects).
        listener: the socket listening on the store's port; owned from now on.
        timeout: seconds, the store's default timeout for its operations.
    """

    def __init__(self, host: str, listener: socket.socket, timeout: float) -> None:
        self.port: int = listener.getsockname()[1]
        self._host, self._listener, self._timeout = host, listener, timeout
        self._server: TorchStore | None = None
        self._failed: StoreError | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._wake_read, self._wake_write = os.pipe()
        self._watcher = threading.Thread(target=self._serve_when_asked, name="asyncdist-run torch store", daemon=True)
        self._watcher.start()

    def server(self) -> TorchStore:
        """torch's store, served from now on if it was not yet (blocking: imports torch).

        Raises:
            StoreError: torch's server could not start, or this was closed.
        """
        with self._lock:
            if self._server is None and self._failed is None:
                if self._closed:
                    raise StoreError("torch's store was closed")
                try:
                    self._server = torch_store_server(self._host, 0, self._timeout, listener=self._listener)
                except StoreError as exc:
                    self._failed = exc
            if self._server is None:
                assert self._failed is not None
                raise self._failed
            return self._server

    def _serve_when_asked(self) -> None:
        listening = self._listener.fileno()
        ready, _, _ = select.select([listening, self._wake_read], [], [])
        if listening in ready and not self._closed:
            try:
                self.server()
            except StoreError as exc:  # the client that connected will time out saying why
                if self._closed:
                    return
                print(f"asyncdist-run: cannot serve torch's store on port {self.port}: {exc}", file=sys.stderr,
                      flush=True)

    def close(self) -> None:
        """Stop the server (or stop listening, if it never started) and free the port (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            os.write(self._wake_write, b"x")
        self._watcher.join()
        with self._lock:
            if self._server is not None:
                self._server.close()
            elif self._failed is None:
                self._listener.close()
            os.close(self._wake_read)
            os.close(self._wake_write)


@dataclass(slots=True)
class JobStores:
    """This launcher's view of the job's stores.

    Attributes:
        config: the launcher's configuration.
        kind: ``"torch"`` (torch's store at ``MASTER_PORT``, asyncdist's at
            ``store_addr``) or ``"asyncdist"`` (asyncdist's alone, at ``MASTER_PORT``).
        store: this launcher's connection to asyncdist's store (node 0's serves it).
        master_port: the port of the store at ``MASTER_ADDR`` (the bound one).
        store_addr: ``ASYNCDIST_STORE_ADDR`` for the workers; None for kind ``"asyncdist"``.
        torch_store: the torch store node 0 serves; None elsewhere and for kind ``"asyncdist"``.
    """

    config: LaunchConfig
    kind: str
    store: TCPStore
    master_port: int
    store_addr: str | None = None
    torch_store: TorchStore | TorchStoreOnDemand | None = None

    def begin_attempt(self, attempt: int, timeout: float) -> bool:
        """Make torch's store fresh for restart ``attempt`` (blocking; any thread).

        Node 0 (whose workers of the last attempt are all gone) closes torch's
        store and serves a new one on the same port, then, on several nodes,
        marks the attempt in asyncdist's store. Another node waits for that
        mark. Nothing to do for attempt 0 or kind ``"asyncdist"``.

        Args:
            attempt: ``TORCHELASTIC_RESTART_COUNT`` of the attempt about to start.
            timeout: seconds another node waits for node 0's mark in this call.

        Returns:
            True when the attempt may start; False when another node's wait
            timed out (the caller decides whether to wait again).

        Raises:
            LaunchError: node 0 cannot bind the port again.
        """
        if self.kind != "torch" or attempt == 0:
            return True
        ready = f"{ATTEMPT_READY_KEY}/{attempt}"
        if self.config.node_rank != 0:
            try:
                self.store.wait([ready], timedelta(seconds=timeout))
            except StoreTimeoutError:
                return False
            return True
        old, self.torch_store = self.torch_store, None
        if old is not None:
            old.close()
        self.torch_store = _serve_torch(self.config, self.master_port)
        if isinstance(self.torch_store, TorchStore):  # several nodes: served at once
            try:  # for a launcher that only now joins, as at the start
                self.torch_store.set(STORE_PORT_KEY, str(self.store.port))
                self.store.set(ready, "1")
            except StoreError as exc:
                raise LaunchError(f"cannot publish attempt {attempt}'s stores: {exc}") from exc
        return True

    def close(self) -> None:
        """Close asyncdist's store and stop torch's server (idempotent)."""
        try:
            self.store.close()
        finally:
            if self.torch_store is not None:
                self.torch_store.close()


def torch_installed() -> bool:
    """Whether torch can be imported here (without importing it)."""
    return importlib.util.find_spec("torch") is not None


def store_kind(environ: Mapping[str, str]) -> str:
    """Which stores to serve: ``ASYNCDIST_AGENT_STORE`` if set, else ``"torch"`` when torch is installed.

    Raises:
        LaunchError: the variable has another value, or says ``torch`` without torch.
    """
    kind = environ.get(AGENT_STORE_KIND_ENV, "").strip().lower()
    if kind not in ("", "torch", "asyncdist"):
        raise LaunchError(f"{AGENT_STORE_KIND_ENV} must be 'torch' or 'asyncdist', got {kind!r}")
    if kind == "asyncdist":
        return kind
    if not torch_installed():
        if kind == "torch":
            raise LaunchError(f"{AGENT_STORE_KIND_ENV}=torch, but torch is not installed")
        return "asyncdist"
    return "torch"


def _asyncdist_store(cfg: LaunchConfig, port: int, secret: str | None, what: str) -> TCPStore:
    serve = cfg.node_rank == 0
    # One node: bind the master address (loopback by default). Several: every
    # interface, since MASTER_ADDR may resolve to a loopback alias on node 0 itself.
    host = cfg.master_addr if serve and cfg.nnodes == 1 else ("" if serve else cfg.master_addr)
    try:
        return TCPStore(host, port, is_master=serve, timeout=JOIN_TIMEOUT, wait_for_workers=False,
                        secret=secret or "")  # the workers' secret: only they may use the store
    except StoreError as exc:
        verb = f"serve {what} on" if serve else "reach node 0's store at"
        raise LaunchError(f"cannot {verb} {cfg.master_addr}:{port}: {exc}") from exc


def _serve_torch(cfg: LaunchConfig, port: int) -> TorchStore | TorchStoreOnDemand:
    """torch's store at ``port``: on demand on one node; at once on several, whose
    launchers read the port of asyncdist's store there."""
    # As asyncdist's store: one node binds the master address (loopback by
    # default, where torch alone would listen on every interface); several
    # nodes every interface.
    try:
        if cfg.nnodes == 1:
            try:
                listener = listen_on(cfg.master_addr, port)
            except OSError as exc:
                raise StoreError(f"cannot listen on {cfg.master_addr}:{port}: {exc}") from exc
            return TorchStoreOnDemand(cfg.master_addr, listener, JOIN_TIMEOUT.total_seconds())
        return torch_store_server(cfg.master_addr, port, JOIN_TIMEOUT.total_seconds(), bind="")
    except StoreError as exc:
        raise LaunchError(f"cannot serve the job's store on {cfg.master_addr}:{port}: {exc}") from exc


def _wait_for_listener(host: str, port: int, timeout: float) -> None:
    """Return once ``host:port`` accepts a TCP connection (blocking, interruptible).

    torch's client waits for a server in C++, where Ctrl-C is not seen until
    it gives up (after minutes, logging a C++ trace per retry); so the
    launcher waits here, in Python, and makes torch's client only once node
    0 is up.

    Raises:
        LaunchError: nothing listened within ``timeout`` seconds.
    """
    start = time.monotonic()
    deadline = start + timeout
    every = report_every()
    report_at = start + min(FIRST_REPORT_SECONDS, every) if every else float("inf")

    def refused(now: float, exc: OSError) -> None:
        nonlocal report_at
        if now >= report_at:  # never a silent wait: see asyncdist.rendezvous.waiting
            report_at = now + every
            print(f"asyncdist-run: waiting for node 0's store at {host}:{port}: {exc}; retrying "
                  f"({duration(now - start)} so far; timeout in {duration(deadline - now)})",
                  file=sys.stderr, flush=True)

    try:
        until_listening(host, port, deadline, refused)  # polling for node 0, as asyncdist's own client does
    except OSError as exc:
        raise LaunchError(f"cannot reach node 0's store at {host}:{port} within {timeout:g} s: {exc}") from exc


def _published_port(cfg: LaunchConfig) -> int:
    """The port of asyncdist's store, read from node 0's torch store (waits for node 0)."""
    _wait_for_listener(cfg.master_addr, cfg.master_port, JOIN_TIMEOUT.total_seconds())
    try:
        client = torch_store_client(cfg.master_addr, cfg.master_port, JOIN_TIMEOUT.total_seconds())
        try:
            return int(client.get(STORE_PORT_KEY))
        finally:
            client.close()
    except (StoreError, ValueError) as exc:
        raise LaunchError(f"cannot reach node 0's store at {cfg.master_addr}:{cfg.master_port}: {exc}") from exc


def open_stores(cfg: LaunchConfig, secret: str | None, kind: str) -> JobStores:
    """Serve (node 0) or join (other nodes) the job's stores of ``kind`` (blocking).

    Args:
        cfg: the launcher's configuration.
        secret: the job's secret, which asyncdist's store is authenticated with (None: none).
        kind: from :func:`store_kind`.

    Raises:
        LaunchError: a port cannot be bound, or node 0 cannot be reached within
            :data:`JOIN_TIMEOUT`.
    """
    if kind == "asyncdist":
        if cfg.node_rank != 0:  # says that it waits for node 0, as with torch's store
            _wait_for_listener(cfg.master_addr, cfg.master_port, JOIN_TIMEOUT.total_seconds())
        store = _asyncdist_store(cfg, cfg.master_port, secret, "the job's store")
        return JobStores(cfg, kind, store, store.port)
    torch_store: TorchStore | TorchStoreOnDemand | None = None
    if cfg.node_rank == 0:
        torch_store = _serve_torch(cfg, cfg.master_port)
        try:
            store = _asyncdist_store(cfg, 0, secret, "asyncdist's store")
        except BaseException:
            torch_store.close()
            raise
        if isinstance(torch_store, TorchStore):  # several nodes: the others read the port there
            try:
                torch_store.set(STORE_PORT_KEY, str(store.port))
            except StoreError as exc:
                JobStores(cfg, kind, store, 0, None, torch_store).close()
                raise LaunchError(f"cannot publish asyncdist's store in torch's: {exc}") from exc
        master_port = torch_store.port
        assert master_port is not None
    else:
        store = _asyncdist_store(cfg, _published_port(cfg), secret, "asyncdist's store")
        master_port = cfg.master_port
    return JobStores(cfg, kind, store, master_port, store_address(cfg.master_addr, store.port), torch_store)

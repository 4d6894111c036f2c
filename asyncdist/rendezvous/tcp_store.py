"""TCPStore: a store served over TCP by the master rank, and its blocking client.

The master starts a server (:mod:`.tcp_server`) on an event loop of its own, in
a daemon thread; every TCPStore, the master's included, is a client of it with
blocking sockets, one connection per calling thread, so a thread blocked in
``get`` never holds up another thread's ``set``. Requests and replies are framed
by :mod:`.tcp_protocol`.

This module owns :class:`TCPStore` (torch's constructor arguments, the worker
count handshake, closing) and :class:`_Client` (any thread): it connects with
backoff until the store's timeout (but a server that accepted it once and now
refuses it has stopped: that fails at once, with
:class:`~asyncdist.errors.StoreLostError`), sends one request at a time per connection,
and waits for the reply for the request's own timeout plus
:data:`_REPLY_SLACK`. It must not know how the server keeps keys or waiters, nor
the frame layout beyond :data:`~.tcp_protocol.HEADER_BYTES`.

Invariants: a request that gets no reply (a socket error, a malformed reply,
the reply timeout) drops that thread's connection, so its next request starts
on a fresh one, and raises :class:`~asyncdist.errors.StoreError`
(:class:`~asyncdist.errors.StoreTimeoutError` for a timeout,
:class:`~asyncdist.errors.ClosedError` once closed) naming the operation and
the store's address. Workers are counted by a ``JOIN`` request each TCPStore
sends when it is constructed, not by a key (torch uses a key), so
``num_keys`` counts the user's keys only. ``use_libuv`` is accepted for torch
compatibility and ignored.

Authentication: a TCPStore with a secret (``secret=``, else ``ASYNCDIST_SECRET``)
serves only clients that prove they know it, and as a client it authenticates
each connection right after connecting, and requires the server to prove it
knows the secret too (:mod:`.tcp_protocol` has the exchange). A client with a
secret refuses a server without one, and a server with one refuses a client
without: both sides must be given the same secret.
"""

from __future__ import annotations

import hmac
import os
import select
import socket
import threading
import time
from datetime import timedelta
from typing import Any

from .. import settings
from ..errors import (
    ClosedError,
    FrameTooLargeError,
    InvalidArgumentError,
    ProtocolError,
    StoreError,
    StoreLostError,
    StoreTimeoutError,
)
from .store import DEFAULT_TIMEOUT, Store
from .store_rules import is_int
from .tcp_protocol import (
    AUTH_SECONDS,
    HEADER_BYTES,
    NONCE_BYTES,
    OP_ADD,
    OP_AUTH,
    OP_CHALLENGE,
    OP_CHECK,
    OP_COMPARE_SET,
    OP_DELETE,
    OP_GET,
    OP_JOIN,
    OP_NAMES,
    OP_NUM_KEYS,
    OP_SET,
    OP_WAIT,
    OP_WAIT_WORKERS,
    STATUS_DENIED,
    STATUS_INVALID,
    STATUS_OK,
    STATUS_TIMEOUT,
    auth_proof,
    decode_response,
    encode_frame,
    frame_length,
)
from .tcp_server import StoreServer
from .tcp_serving import open_server, release_server

__all__ = ["TCPStore"]

_REPLY_SLACK = 10.0  # seconds a client waits for a reply beyond the request's timeout


def _as_secret(secret: str | bytes | None) -> bytes | None:
    """``secret=`` as bytes: None reads ``ASYNCDIST_SECRET``; empty means no secret."""
    if secret is None:
        secret = settings.refresh().secret or ""  # a store may be made before init: read now
    if isinstance(secret, str):
        secret = secret.encode()
    if not isinstance(secret, bytes):
        raise InvalidArgumentError(f"TCPStore: secret must be str, bytes or None, got {type(secret).__name__}")
    return secret or None


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("the store closed the connection")
        got += k
    return bytes(buf)


def _readable(sock: socket.socket) -> bool:
    """Whether an idle connection has something to read: between requests the
    server sends nothing, so that is its close (or a reset), seen without waiting."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


class _Client:
    """Blocking connections to one store server, one per calling thread,
    each authenticated first when there is a ``secret``."""

    def __init__(self, host: str, port: int, secret: bytes | None = None) -> None:
        self.where = f"{host}:{port}"
        self._secret = secret
        self._addr = ("127.0.0.1" if host in ("", "0.0.0.0") else host, port)
        self._local = threading.local()
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._served = False  # a connection was accepted once: a refusal now is a server that stopped

    def _connect(self, timeout: float) -> socket.socket:
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            try:
                sock = socket.create_connection(self._addr, timeout=max(deadline - time.monotonic(), 0.01))
                break
            except OSError as exc:
                if self._closed:
                    raise ClosedError(f"TCPStore: the client of {self.where} is closed") from exc
                if self._served and isinstance(exc, ConnectionRefusedError):
                    raise StoreLostError(
                        f"TCPStore: the store at {self.where} is gone: it served this client before and now "
                        "refuses connections, so its server has stopped (under tcp:// and env:// by hand, rank 0 "
                        "serves it: is rank 0 dead?)") from exc
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise StoreTimeoutError(f"TCPStore: could not connect to the store at "
                                            f"{self.where} within {timeout:g} s: {exc}") from exc
                time.sleep(min(delay, remaining))
                delay = min(delay * 2, 0.5)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            if self._closed:
                sock.close()
                raise ClosedError(f"TCPStore: the client of {self.where} is closed")
            self._sockets.add(sock)
        if self._secret is not None:
            try:
                self._authenticate(sock, timeout)
            except BaseException:
                self._discard(sock)
                raise
        self._served = True
        return sock

    def _authenticate(self, sock: socket.socket, timeout: float) -> None:
        """Prove to the server that we know the secret, and have it prove it back.

        Raises:
            StoreError: the server has no secret or another one, or cannot be reached.
        """
        secret = self._secret
        assert secret is not None
        client_nonce = os.urandom(NONCE_BYTES)
        try:
            # A live server answers at once (and drops us after AUTH_SECONDS);
            # silence is a server that stops, to be given up as lost.
            sock.settimeout(min(timeout + _REPLY_SLACK, AUTH_SECONDS))
            _, server_nonce = self._round_trip(sock, encode_frame([OP_CHALLENGE]))
            if not isinstance(server_nonce, bytes) or len(server_nonce) != NONCE_BYTES:
                raise StoreError(f"TCPStore: the store at {self.where} does not authenticate its clients (it has "
                                 "no secret) but this client has one; give both the same secret")
            proof = auth_proof(secret, "client", server_nonce, client_nonce)
            status, answer = self._round_trip(sock, encode_frame([OP_AUTH, client_nonce, proof]))
        except (OSError, ProtocolError) as exc:
            error = StoreLostError if isinstance(exc, (ConnectionError, TimeoutError)) else StoreError
            raise error(f"TCPStore: authenticating with the store at {self.where} failed: {exc}") from exc
        if status == STATUS_DENIED:
            raise StoreError(f"TCPStore: the store at {self.where} refused this client: {answer} "
                             "(not the store's secret: a process of another run, or a stale one of an earlier run?)")
        expected = auth_proof(secret, "server", server_nonce, client_nonce)
        if not isinstance(answer, bytes) or not hmac.compare_digest(answer, expected):
            raise StoreError(f"TCPStore: the store at {self.where} failed to prove that it knows the secret")

    @staticmethod
    def _round_trip(sock: socket.socket, frame: bytes) -> tuple[int, Any]:
        sock.sendall(frame)
        return decode_response(_recv_exact(sock, frame_length(_recv_exact(sock, HEADER_BYTES))))

    def _discard(self, sock: socket.socket) -> None:
        self._local.sock = None
        with self._lock:
            self._sockets.discard(sock)
        sock.close()

    def call(self, op: int, args: list, timeout: float, store_timeout: float) -> tuple[int, Any]:
        """Send one request and return ``(status, value)`` of its reply.

        ``timeout`` is the request's own (what the server may wait); connecting
        may take up to ``store_timeout``.
        """
        try:
            frame = encode_frame([op, *args])
        except FrameTooLargeError as exc:
            raise InvalidArgumentError(f"TCPStore.{OP_NAMES[op]}: {exc}") from None
        sock = getattr(self._local, "sock", None)
        if sock is not None and _readable(sock):  # the server closed it while idle: start afresh
            self._discard(sock)
            sock = None
        if sock is None:
            sock = self._local.sock = self._connect(store_timeout)
        try:
            sock.settimeout(timeout + _REPLY_SLACK)
            status, value = self._round_trip(sock, frame)
        except (OSError, ProtocolError) as exc:
            self._discard(sock)
            if self._closed:
                raise ClosedError(f"TCPStore.{OP_NAMES[op]}: the store is closed") from exc
            error = (StoreTimeoutError if isinstance(exc, TimeoutError)
                     else StoreLostError if isinstance(exc, ConnectionError) else StoreError)
            raise error(f"TCPStore.{OP_NAMES[op]}: no reply from the store at {self.where}: "
                        f"{exc}") from exc
        if status == STATUS_INVALID:
            raise InvalidArgumentError(value)
        if status == STATUS_DENIED:
            self._discard(sock)
            raise StoreError(f"TCPStore.{OP_NAMES[op]}: the store at {self.where} refused the request: {value}")
        return status, value

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            try:  # shutdown wakes a thread blocked in recv on it; close alone does not
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


class TCPStore(Store):
    """A store served by the master over TCP (``torch.distributed.TCPStore``).

    Args:
        host_name: the master's host name or address. The master binds it (``""``
            or ``"0.0.0.0"``: every IPv4 interface); clients connect to it.
        port: the master's port; ``0`` with ``is_master`` binds a free port,
            readable from :attr:`port`.
        world_size: the number of TCPStores of the job, the master's included.
        is_master: serve the store from this process.
        timeout: default timeout of ``get``, ``wait`` and connecting (a ``timedelta`` or seconds).
        wait_for_workers: the master's constructor returns only once
            ``world_size`` TCPStores have connected.
        multi_tenant: masters of this process with the same port share one server.
        master_listen_fd: a bound, listening socket for the master to serve on.
        use_libuv: ignored (torch's backend switch).
        secret: the job's secret (str or bytes), which every client must prove
            it knows before it is served; None reads ``ASYNCDIST_SECRET``, and
            ``""`` means no authentication. Keyword-only; not in torch.

    Raises:
        StoreError: the master cannot listen on ``host_name:port``.
        StoreTimeoutError: the master is unreachable, or too few workers joined,
            within ``timeout``.
        StoreError: the client and the server do not have the same secret.

    Example:
        >>> master = TCPStore("127.0.0.1", 0, world_size=2, is_master=True,
        ...                   wait_for_workers=False)
        >>> worker = TCPStore("127.0.0.1", master.port, world_size=2)
    """

    def __init__(self, host_name: str, port: int, world_size: int | None = None,
                 is_master: bool = False, timeout: timedelta | float = DEFAULT_TIMEOUT,
                 wait_for_workers: bool = True, multi_tenant: bool = False,
                 master_listen_fd: int | None = None, use_libuv: bool = True, *,
                 secret: str | bytes | None = None) -> None:
        super().__init__(timeout)
        key = _as_secret(secret)
        if not is_int(port) or not 0 <= port <= 65535 or (port == 0 and not is_master):
            raise InvalidArgumentError(f"TCPStore: bad port {port!r} (a client needs the master's)")
        if world_size == -1:  # torch's "unknown"
            world_size = None
        if world_size is not None and (not is_int(world_size) or world_size < 1):
            raise InvalidArgumentError(f"TCPStore: world_size must be None or >= 1, got {world_size!r}")
        self._host = host_name
        self._server: StoreServer | None = None
        if is_master:
            self._server = open_server(host_name, port, master_listen_fd, multi_tenant, key)
            port = self._server.port
        self._port = port
        self._client = _Client(host_name, port, key)
        try:
            self._join()
            if is_master and world_size is not None and wait_for_workers:
                seconds = self._timeout_s
                status, joined = self._call(OP_WAIT_WORKERS, world_size, seconds, timeout=seconds)
                if status == STATUS_TIMEOUT:
                    raise StoreTimeoutError(f"TCPStore: only {joined} of {world_size} workers "
                                            f"joined the store at {self._client.where} "
                                            f"within {seconds:g} s")
        except BaseException:
            self.close()
            raise

    def _join(self) -> None:
        """Count this TCPStore among the store's workers.

        A client may reach the store of the last generation on this port
        while its master stops it (a ``destroy_process_group`` then
        ``init_process_group`` on one port): a connection lost before the
        reply is tried again, afresh, until the store's timeout.
        """
        deadline = time.monotonic() + self._timeout_s
        delay = 0.01
        while True:
            try:
                self._call(OP_JOIN)
                return
            except StoreLostError:
                remaining = deadline - time.monotonic()
                if self._server is not None or remaining <= 0:
                    raise
                time.sleep(min(delay, remaining))  # backoff, as when connecting
                delay = min(delay * 2, 0.5)

    @property
    def host(self) -> str:
        """The master's host name, as given."""
        return self._host

    @property
    def port(self) -> int:
        """The master's port (the bound one when the master was given port 0)."""
        return self._port

    def _call(self, op: int, *args: Any, timeout: float | None = None) -> tuple[int, Any]:
        store_timeout = self._timeout_s
        return self._client.call(op, list(args), store_timeout if timeout is None else timeout,
                                 store_timeout)

    def _set(self, key: str, value: bytes) -> None:
        self._call(OP_SET, key, value)

    def _get(self, key: str, timeout: float) -> bytes | None:
        status, value = self._call(OP_GET, key, timeout, timeout=timeout)
        return value if status == STATUS_OK else None

    def _add(self, key: str, amount: int) -> int:
        return self._call(OP_ADD, key, amount)[1]

    def _compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        return self._call(OP_COMPARE_SET, key, expected, desired)[1]

    def _wait(self, keys: list[str], timeout: float) -> list[str]:
        status, missing = self._call(OP_WAIT, keys, timeout, timeout=timeout)
        return [] if status == STATUS_OK else missing

    def _check(self, keys: list[str]) -> bool:
        return self._call(OP_CHECK, keys)[1]

    def _delete_key(self, key: str) -> bool:
        return self._call(OP_DELETE, key)[1]

    def _num_keys(self) -> int:
        return self._call(OP_NUM_KEYS)[1]

    def _close(self) -> None:
        self._client.close()
        server, self._server = self._server, None
        if server is not None:
            release_server(server)

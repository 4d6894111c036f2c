"""TCPStore: a store served over TCP by the master rank, on asyncio.

The master runs the server on an event loop of its own, in a daemon thread named
``asyncdist-tcpstore``; every TCPStore, the master's included, is a client of it
with blocking sockets, one connection per calling thread, so a thread blocked in
``get`` never holds up another thread's ``set``.

This module owns the store protocol, in three parts:

* **Encoding** (pure functions, no sockets): a frame is a 4-byte big-endian
  length and that many bytes of msgpack. A request is ``[op, *args]``; a reply is
  ``[status, value]``. Lengths over :data:`MAX_FRAME_BYTES` are refused before
  anything is allocated. :func:`decode_request` checks every argument's type, so
  the server's handlers see only well-formed calls.
* **The server** (:class:`_StoreServer`, loop thread only): the dict, and per-key
  sets of waiter futures. Blocking ``get``/``wait`` park a future on a missing key
  and are woken by the write that sets it, or answer ``STATUS_TIMEOUT`` at the
  deadline the client sent; nothing polls. A connection that closes mid-wait
  cancels its request, whose ``finally`` removes its waiter. A malformed frame
  closes that connection only, and is logged on ``asyncdist.store``.
* **The client** (:class:`_Client`, any thread): connects with backoff until the
  store's timeout, sends one request at a time per connection, and waits for the
  reply for the request's own timeout plus :data:`_REPLY_SLACK`.

Workers are counted by a ``JOIN`` request each TCPStore sends when it is
constructed, not by a key (torch uses a key), so ``num_keys`` counts the user's
keys only. ``use_libuv`` is accepted for torch compatibility and ignored.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import socket
import struct
import threading
import time
from collections.abc import Callable, Hashable
from datetime import timedelta
from typing import Any

import msgpack

from ..errors import (
    ClosedError,
    FrameTooLargeError,
    InvalidArgumentError,
    ProtocolError,
    StoreError,
    StoreTimeoutError,
)
from .store import DEFAULT_TIMEOUT, Store, apply_add, apply_compare_set

__all__ = ["MAX_FRAME_BYTES", "TCPStore", "FrameDecoder", "encode_frame", "decode_request",
           "decode_response", "frame_length"]

logger = logging.getLogger("asyncdist.store")

#: Largest frame either side accepts: a rendezvous value (addresses, an NCCL id,
#: a pickled object list) is far smaller; the bound stops a bad length prefix
#: from making the server allocate gigabytes.
MAX_FRAME_BYTES = 64 * 1024 * 1024
_HEADER = struct.Struct(">I")
_REPLY_SLACK = 10.0  # seconds a client waits for a reply beyond the request's timeout
_MAX_PIPELINED = 64  # requests queued on one connection before it is refused

OP_SET, OP_GET, OP_ADD, OP_COMPARE_SET, OP_WAIT = 1, 2, 3, 4, 5
OP_CHECK, OP_DELETE, OP_NUM_KEYS, OP_JOIN, OP_WAIT_WORKERS = 6, 7, 8, 9, 10
STATUS_OK, STATUS_TIMEOUT, STATUS_INVALID = 0, 1, 2

_OP_NAMES = {OP_SET: "set", OP_GET: "get", OP_ADD: "add", OP_COMPARE_SET: "compare_set",
             OP_WAIT: "wait", OP_CHECK: "check", OP_DELETE: "delete_key",
             OP_NUM_KEYS: "num_keys", OP_JOIN: "join", OP_WAIT_WORKERS: "wait_for_workers"}


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_seconds(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < math.inf


def _is_keys(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(k, str) for k in x)


def _is_str(x: Any) -> bool:
    return isinstance(x, str)


def _is_bytes(x: Any) -> bool:
    return isinstance(x, bytes)


_SIGNATURES: dict[int, tuple[Callable[[Any], bool], ...]] = {
    OP_SET: (_is_str, _is_bytes), OP_GET: (_is_str, _is_seconds), OP_ADD: (_is_str, _is_int),
    OP_COMPARE_SET: (_is_str, _is_bytes, _is_bytes), OP_WAIT: (_is_keys, _is_seconds),
    OP_CHECK: (_is_keys,), OP_DELETE: (_is_str,), OP_NUM_KEYS: (), OP_JOIN: (),
    OP_WAIT_WORKERS: (_is_int, _is_seconds),
}

# -- encoding (pure) --------------------------------------------------------


def encode_frame(message: list) -> bytes:
    """Return the frame of ``message`` (a request or a reply): length + msgpack."""
    body = msgpack.packb(message, use_bin_type=True)
    if len(body) > MAX_FRAME_BYTES:
        raise FrameTooLargeError(f"store frame of {len(body)} bytes exceeds {MAX_FRAME_BYTES}")
    return _HEADER.pack(len(body)) + body


def frame_length(header: bytes) -> int:
    """Return the body length announced by a 4-byte frame header.

    Raises:
        FrameTooLargeError: the length exceeds :data:`MAX_FRAME_BYTES`.
    """
    (length,) = _HEADER.unpack(header)
    if length > MAX_FRAME_BYTES:
        raise FrameTooLargeError(f"store frame announces {length} bytes, limit {MAX_FRAME_BYTES}")
    return length


class FrameDecoder:
    """Split a byte stream into frame bodies (sans-I/O). ``feed`` returns whole bodies."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """Add received bytes; return the complete frame bodies, oldest first.

        Raises:
            FrameTooLargeError: a header announces more than :data:`MAX_FRAME_BYTES`.
        """
        self._buf += data
        bodies = []
        while len(self._buf) >= _HEADER.size:
            end = _HEADER.size + frame_length(bytes(self._buf[: _HEADER.size]))
            if len(self._buf) < end:
                break
            bodies.append(bytes(self._buf[_HEADER.size : end]))
            del self._buf[:end]
        return bodies


def _unpack(body: bytes, what: str) -> list:
    try:
        message = msgpack.unpackb(body, raw=False, use_list=True)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ProtocolError(f"store {what} is not valid msgpack: {exc}") from exc
    if not isinstance(message, list) or not message or not _is_int(message[0]):
        raise ProtocolError(f"store {what} is not a list starting with an int code")
    return message


def decode_request(body: bytes) -> tuple[int, list]:
    """Return ``(op, args)`` of a request body, its argument types checked.

    Raises:
        ProtocolError: not msgpack, unknown op, or wrong arguments.
    """
    op, *args = _unpack(body, "request")
    checks = _SIGNATURES.get(op)
    if checks is None:
        raise ProtocolError(f"store request has unknown op {op}")
    if len(args) != len(checks) or not all(ok(a) for ok, a in zip(checks, args)):
        raise ProtocolError(f"store request {_OP_NAMES[op]} has malformed arguments")
    return op, args


def decode_response(body: bytes) -> tuple[int, Any]:
    """Return ``(status, value)`` of a reply body. Raises ProtocolError if malformed."""
    message = _unpack(body, "reply")
    if len(message) != 2 or message[0] not in (STATUS_OK, STATUS_TIMEOUT, STATUS_INVALID):
        raise ProtocolError(f"store reply is malformed: {message[:3]!r}")
    return message[0], message[1]


# -- the server (loop thread only, except start and stop) -------------------

_WORKERS = object()  # the waiter key of wait_for_workers


class _Connection(asyncio.Protocol):
    """One client connection: frames in, one request served at a time, replies out."""

    def __init__(self, server: _StoreServer) -> None:
        self._server = server
        self._decoder = FrameDecoder()
        self._pending: collections.deque[bytes] = collections.deque()
        self._task: asyncio.Task | None = None
        self._writable = asyncio.Event()
        self._writable.set()
        self.lost = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport: asyncio.Transport = transport  # type: ignore[assignment]
        self._peer = transport.get_extra_info("peername")
        self._server.connections.add(self)

    def data_received(self, data: bytes) -> None:
        try:
            self._pending.extend(self._decoder.feed(data))
            if len(self._pending) > _MAX_PIPELINED:
                raise ProtocolError(f"more than {_MAX_PIPELINED} requests queued")
        except ProtocolError as exc:
            self.drop(exc)
            return
        if self._task is None and self._pending:
            self._task = asyncio.get_running_loop().create_task(self._serve())

    async def _serve(self) -> None:
        try:
            while self._pending:
                await self._writable.wait()
                op, args = decode_request(self._pending.popleft())
                reply = await self._server.handle(op, args)
                self._transport.write(encode_frame(reply))
        except ProtocolError as exc:
            self.drop(exc)
        except Exception as exc:  # a bug must not take the server down
            logger.exception("TCPStore server: error serving %s", self._peer)
            self.drop(exc)
        finally:
            self._task = None

    def drop(self, exc: BaseException) -> None:
        logger.warning("TCPStore server: closing the connection from %s: %s", self._peer, exc)
        self._transport.abort()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        if self._task is not None:
            self._task.cancel()  # its finally removes its waiter
        self._writable.set()
        self.lost.set_result(None)


class _StoreServer:
    """The keys and their waiters, served on an event loop in a daemon thread."""

    def __init__(self, sock: socket.socket) -> None:
        self.port: int = sock.getsockname()[1]
        self.tenants = 1  # TCPStores of this process sharing it (multi_tenant)
        self.connections: set[_Connection] = set()
        self._data: dict[str, bytes] = {}
        self._waiters: dict[Hashable, set[asyncio.Future]] = {}
        self._workers = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="asyncdist-tcpstore", daemon=True)
        self._thread.start()
        try:
            self._call(self._start(sock))
        except BaseException:
            sock.close()
            self.stop()
            raise

    def _run(self) -> None:
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _start(self, sock: socket.socket) -> None:
        self._listener = await self._loop.create_server(lambda: _Connection(self), sock=sock)

    async def _stop(self) -> None:
        self._listener.close()
        connections = list(self.connections)
        tasks = [c._task for c in connections if c._task is not None]
        for c in connections:
            c._transport.abort()
        await asyncio.gather(*(c.lost for c in connections))
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._listener.wait_closed()

    def stop(self) -> None:
        """Close every connection and the listener, and end the thread (any thread)."""
        if not self._thread.is_alive():
            return
        if hasattr(self, "_listener"):
            self._call(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()

    # -- requests ---------------------------------------------------------

    def _notify(self, key: Hashable) -> None:
        for future in self._waiters.pop(key, ()):
            if not future.done():
                future.set_result(None)

    async def _until(self, ready: Callable[[], bool], watch: Callable[[], Hashable],
                     timeout: float) -> bool:
        """Wait until ``ready()``, parked on the key ``watch()`` names; False at the deadline."""
        deadline = self._loop.time() + timeout
        while not ready():
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                return False
            key = watch()
            future = self._loop.create_future()
            waiters = self._waiters.setdefault(key, set())
            waiters.add(future)
            try:
                await asyncio.wait((future,), timeout=remaining)
            finally:
                waiters.discard(future)
                if not waiters and self._waiters.get(key) is waiters:
                    del self._waiters[key]
        return True

    def _missing(self, keys: list[str]) -> list[str]:
        return [k for k in keys if k not in self._data]

    async def handle(self, op: int, args: list) -> list:
        """Serve one decoded request; return the reply ``[status, value]``."""
        data = self._data
        if op == OP_SET:
            data[args[0]] = args[1]
            self._notify(args[0])
            return [STATUS_OK, None]
        if op in (OP_GET, OP_WAIT):
            keys = [args[0]] if op == OP_GET else args[0]
            if not await self._until(lambda: not self._missing(keys),
                                     lambda: self._missing(keys)[0], args[1]):
                return [STATUS_TIMEOUT, self._missing(keys)]
            return [STATUS_OK, data[args[0]] if op == OP_GET else None]
        if op == OP_ADD:
            try:
                value = apply_add(args[0], data.get(args[0]), args[1])
            except InvalidArgumentError as exc:
                return [STATUS_INVALID, str(exc)]
            data[args[0]] = str(value).encode()
            self._notify(args[0])
            return [STATUS_OK, value]
        if op == OP_COMPARE_SET:
            new, reply = apply_compare_set(data.get(args[0]), args[1], args[2])
            if new is not None:
                data[args[0]] = new
                self._notify(args[0])
            return [STATUS_OK, reply]
        if op == OP_CHECK:
            return [STATUS_OK, not self._missing(args[0])]
        if op == OP_DELETE:
            return [STATUS_OK, data.pop(args[0], None) is not None]
        if op == OP_NUM_KEYS:
            return [STATUS_OK, len(data)]
        if op == OP_JOIN:
            self._workers += 1
            self._notify(_WORKERS)
            return [STATUS_OK, self._workers]
        # OP_WAIT_WORKERS (decode_request admits no other op)
        ok = await self._until(lambda: self._workers >= args[0], lambda: _WORKERS, args[1])
        return [STATUS_OK if ok else STATUS_TIMEOUT, self._workers]


def _listen(host: str, port: int, listen_fd: int | None) -> socket.socket:
    """Bind and listen on one socket (one port even for names with several addresses),
    or adopt the listening socket ``listen_fd``."""
    try:
        if listen_fd is not None:
            return socket.socket(fileno=listen_fd)
        family, kind, proto, _, addr = socket.getaddrinfo(
            host or "0.0.0.0", port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
            sock.listen(1024)
        except BaseException:
            sock.close()
            raise
    except OSError as exc:
        raise StoreError(f"TCPStore: cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    return sock


# multi_tenant masters of this process that share a server, by port (as torch does).
_TENANTS: dict[int, _StoreServer] = {}
_TENANTS_LOCK = threading.Lock()


# -- the client (any thread) -------------------------------------------------


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


class _Client:
    """Blocking connections to one store server, one per calling thread."""

    def __init__(self, host: str, port: int) -> None:
        self.where = f"{host}:{port}"
        self._addr = ("127.0.0.1" if host in ("", "0.0.0.0") else host, port)
        self._local = threading.local()
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False

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
        return sock

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
            raise InvalidArgumentError(f"TCPStore.{_OP_NAMES[op]}: {exc}") from None
        sock = getattr(self._local, "sock", None)
        if sock is None:
            sock = self._local.sock = self._connect(store_timeout)
        try:
            sock.settimeout(timeout + _REPLY_SLACK)
            sock.sendall(frame)
            status, value = decode_response(_recv_exact(sock, frame_length(_recv_exact(sock, 4))))
        except (OSError, ProtocolError) as exc:
            self._discard(sock)
            if self._closed:
                raise ClosedError(f"TCPStore.{_OP_NAMES[op]}: the store is closed") from exc
            error = StoreTimeoutError if isinstance(exc, TimeoutError) else StoreError
            raise error(f"TCPStore.{_OP_NAMES[op]}: no reply from the store at {self.where}: "
                        f"{exc}") from exc
        if status == STATUS_INVALID:
            raise InvalidArgumentError(value)
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
        timeout: default timeout of ``get``, ``wait`` and connecting.
        wait_for_workers: the master's constructor returns only once
            ``world_size`` TCPStores have connected.
        multi_tenant: masters of this process with the same port share one server.
        master_listen_fd: a bound, listening socket for the master to serve on.
        use_libuv: ignored (torch's backend switch).

    Raises:
        StoreError: the master cannot listen on ``host_name:port``.
        StoreTimeoutError: the master is unreachable, or too few workers joined,
            within ``timeout``.

    Example:
        >>> master = TCPStore("127.0.0.1", 0, world_size=2, is_master=True,
        ...                   wait_for_workers=False)
        >>> worker = TCPStore("127.0.0.1", master.port, world_size=2)
    """

    def __init__(self, host_name: str, port: int, world_size: int | None = None,
                 is_master: bool = False, timeout: timedelta = DEFAULT_TIMEOUT,
                 wait_for_workers: bool = True, multi_tenant: bool = False,
                 master_listen_fd: int | None = None, use_libuv: bool = True) -> None:
        super().__init__(timeout)
        if not _is_int(port) or not 0 <= port <= 65535 or (port == 0 and not is_master):
            raise InvalidArgumentError(f"TCPStore: bad port {port!r} (a client needs the master's)")
        if world_size == -1:  # torch's "unknown"
            world_size = None
        if world_size is not None and (not _is_int(world_size) or world_size < 1):
            raise InvalidArgumentError(f"TCPStore: world_size must be None or >= 1, got {world_size!r}")
        self._host = host_name
        self._server: _StoreServer | None = None
        self._multi_tenant = multi_tenant
        if is_master:
            self._server = self._serve(host_name, port, master_listen_fd)
            port = self._server.port
        self._port = port
        self._client = _Client(host_name, port)
        try:
            self._call(OP_JOIN)
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

    def _serve(self, host: str, port: int, listen_fd: int | None) -> _StoreServer:
        with _TENANTS_LOCK:
            server = _TENANTS.get(port) if self._multi_tenant else None
            if server is not None:
                server.tenants += 1
                return server
            server = _StoreServer(_listen(host, port, listen_fd))
            if self._multi_tenant:
                _TENANTS[server.port] = server
            return server

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
        if server is None:
            return
        with _TENANTS_LOCK:
            server.tenants -= 1
            if server.tenants > 0:
                return
            if _TENANTS.get(server.port) is server:
                del _TENANTS[server.port]
        server.stop()

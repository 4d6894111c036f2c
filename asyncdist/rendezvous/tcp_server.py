"""The TCP store's server: the keys and their waiters, on an event loop of its own.

The master's :class:`~asyncdist.rendezvous.tcp_store.TCPStore` starts a
:class:`StoreServer`, which runs an asyncio server on a new event loop in a
daemon thread named ``asyncdist-tcpstore``. This module owns that thread, the
connections, the dict, the per-key waiters and the count of joined workers;
:mod:`.tcp_serving` binds the port and shares servers between masters.

It must not know the frame format (:mod:`.tcp_protocol` decodes and encodes),
what ``add`` and ``compare_set`` compute (:mod:`.store_rules`), or anything of
the client side.

Invariants:

* Everything but :meth:`StoreServer.stop` runs on the server's loop thread.
* Nothing polls. A ``get``/``wait`` on a missing key parks a future on that key
  and is woken by the write that sets it, or answers ``STATUS_TIMEOUT`` at the
  deadline the client sent.
* Each connection serves one request at a time, in order; a connection that
  closes mid-wait cancels its request, whose ``finally`` removes its waiter, so
  no waiter outlives its client.
* A malformed frame, more than :data:`_MAX_PIPELINED` queued requests, or more
  than :data:`~.tcp_protocol.MAX_FRAME_BYTES` of them (a client sends one
  request at a time, so one connection holds one frame's worth at most),
  closes that connection only, logged on ``asyncdist.store``; the server serves on.
* With a secret, a connection is served nothing before it has authenticated
  (:mod:`.tcp_protocol` describes the exchange): any other request is refused
  with ``STATUS_DENIED``, logged, and the connection closed, as is a connection
  that has not authenticated within :data:`~.tcp_protocol.AUTH_SECONDS`.
* At most :data:`~.tcp_admission.MAX_UNAUTHENTICATED` connections wait to authenticate at
  once; the next one closes the oldest. Each may hold at most
  :data:`~.tcp_protocol.MAX_AUTH_FRAME_BYTES` of an incomplete frame and
  :data:`_MAX_PIPELINED` queued requests, so all of them together hold a few
  MiB at most.
* Incomplete frames hold what has arrived, within the budget of
  :class:`~.tcp_admission.PartialFrames`.
* Refusals are logged through one :class:`~asyncdist._refusals.RefusalLog`:
  a few in full, then a summary every 10 s.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
import threading
from collections.abc import Callable, Hashable
from typing import Any, cast

from .._refusals import RefusalLog
from ..errors import InvalidArgumentError, ProtocolError
from .store_rules import apply_add, apply_compare_set
from .tcp_admission import MAX_UNAUTHENTICATED, Gate, PartialFrames
from .tcp_protocol import (
    AUTH_SECONDS,
    MAX_AUTH_FRAME_BYTES,
    MAX_FRAME_BYTES,
    OP_ADD,
    OP_AUTH,
    OP_CHALLENGE,
    OP_CHECK,
    OP_COMPARE_SET,
    OP_DELETE,
    OP_GET,
    OP_JOIN,
    OP_NUM_KEYS,
    OP_SET,
    OP_WAIT,
    STATUS_DENIED,
    STATUS_INVALID,
    STATUS_OK,
    STATUS_TIMEOUT,
    FrameDecoder,
    decode_request,
    encode_frame,
)

__all__ = ["StoreServer"]

logger = logging.getLogger("asyncdist.store")

_MAX_PIPELINED = 64  # requests queued on one connection before it is refused
_WORKERS = object()  # the waiter key of wait_for_workers
class _Connection(asyncio.Protocol):
    """One client connection: frames in, one request served at a time, replies out."""

    def __init__(self, server: StoreServer) -> None:
        self._server = server
        self._gate = Gate(server.secret)
        self._decoder = FrameDecoder(MAX_FRAME_BYTES if self._gate.open else MAX_AUTH_FRAME_BYTES)
        self._expiry: asyncio.TimerHandle | None = None
        self._pending: collections.deque[bytes] = collections.deque()
        self._queued = 0  # bytes of the requests in _pending
        self._task: asyncio.Task | None = None
        self._writable = asyncio.Event()
        self._writable.set()
        self.lost = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # asyncio types this hook for every kind of protocol; a stream server's
        # transport is a Transport in behaviour (uvloop's does not subclass it).
        self._transport = cast(asyncio.Transport, transport)
        self._peer = transport.get_extra_info("peername")
        if self._server.stopping:  # accepted as the listener closed: the client tries the next server
            self._transport.abort()
            return
        self._server.connections.add(self)
        if not self._gate.open:
            self._expiry = asyncio.get_running_loop().call_later(AUTH_SECONDS, self._auth_expired)
            self._server.admit_unauthenticated(self)

    def _auth_expired(self) -> None:
        self.drop(ProtocolError(f"did not authenticate within {AUTH_SECONDS:g} s"), "timed out")

    def data_received(self, data: bytes) -> None:
        try:
            for frame in self._decoder.feed(data):
                self._pending.append(frame)
                self._queued += len(frame)
            if len(self._pending) > _MAX_PIPELINED:
                raise ProtocolError(f"more than {_MAX_PIPELINED} requests queued")
            if self._queued > MAX_FRAME_BYTES:  # our client sends one request at a time
                raise ProtocolError(f"more than {MAX_FRAME_BYTES} bytes of requests queued")
        except ProtocolError as exc:
            self.drop(exc)
            return
        self._server.partial.update(self, self._decoder.buffered)
        if self._task is None and self._pending:
            self._task = asyncio.get_running_loop().create_task(self._serve())

    async def _serve(self) -> None:
        try:
            while self._pending:
                await self._writable.wait()
                frame = self._pending.popleft()
                self._queued -= len(frame)
                op, args = decode_request(frame)
                if op in (OP_CHALLENGE, OP_AUTH) or not self._gate.open:
                    reply = self._gate.answer(op, args)
                    if reply[0] == STATUS_DENIED:
                        self._refuse(reply)
                        return
                    if self._gate.open:
                        self._authenticated()
                else:
                    reply = await self._server.handle(op, args)
                self._transport.write(encode_frame(reply))
        except ProtocolError as exc:
            self.drop(exc)
        except Exception as exc:  # a bug must not take the server down
            logger.exception("TCPStore server: error serving %s", self._peer)
            self.drop(exc)
        finally:
            self._task = None

    def _authenticated(self) -> None:
        self._decoder.max_frame = MAX_FRAME_BYTES
        self._server.unauthenticated.pop(self, None)
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None

    def _refuse(self, reply: list) -> None:
        """Answer an unauthenticated request with its refusal, then close."""
        self._server.refusals.note("refused", "TCPStore server: refused the connection from %s: %s",
                                   self._peer, reply[1])
        self._pending.clear()
        self._queued = 0
        self._transport.write(encode_frame(reply))
        self._transport.close()  # after the refusal is written

    def drop(self, exc: BaseException, kind: str = "closed") -> None:
        self._server.refusals.note(kind, "TCPStore server: closing the connection from %s: %s", self._peer, exc)
        self._transport.abort()

    def pause_reading(self) -> None:
        """Stop reading: incomplete frames hold too much (see :class:`~.tcp_admission.PartialFrames`)."""
        if not self._transport.is_closing():
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if not self._transport.is_closing():
            self._transport.resume_reading()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        self._server.unauthenticated.pop(self, None)
        self._server.partial.update(self, 0)
        if self._expiry is not None:
            self._expiry.cancel()
        if self._task is not None:
            self._task.cancel()  # its finally removes its waiter
        self._writable.set()
        self.lost.set_result(None)


class StoreServer:
    """The keys and their waiters, served on ``sock`` by an event loop in a daemon thread.

    The constructor returns once the server is listening; :meth:`stop` ends it.
    With a ``secret``, clients must authenticate before they are served.
    """

    def __init__(self, sock: socket.socket, secret: bytes | None = None) -> None:
        self.secret = secret
        self.port: int = sock.getsockname()[1]
        self.tenants = 1  # TCPStores of this process sharing it (multi_tenant)
        self.connections: set[_Connection] = set()
        self.stopping = False  # a connection the listener accepts from now on is closed at once
        # Connections waiting to authenticate, oldest first.
        self.unauthenticated: collections.OrderedDict[_Connection, None] = collections.OrderedDict()
        self.partial = PartialFrames()
        self.refusals = RefusalLog(logger, "TCPStore server")
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

    def admit_unauthenticated(self, conn: _Connection) -> None:
        """Count ``conn`` among those waiting to authenticate, closing the oldest
        when there are :data:`~.tcp_admission.MAX_UNAUTHENTICATED` already (loop thread)."""
        if len(self.unauthenticated) >= MAX_UNAUTHENTICATED:
            oldest, _ = self.unauthenticated.popitem(last=False)
            oldest.drop(ProtocolError(f"{MAX_UNAUTHENTICATED} connections are waiting to authenticate: "
                                      "closed the oldest"), "evicted")
        self.unauthenticated[conn] = None

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
        """Close the listener and every connection, also one the listener
        accepted as it closed: left open, its client (a rank back in init on
        this port, see :mod:`asyncdist.group.bootstrap`) would wait for a reply
        until its timeout instead of trying the next server."""
        self.stopping = True
        self._listener.close()
        for _ in range(3):  # the turns an accepted connection takes to be made
            await asyncio.sleep(0)
        connections = list(self.connections)
        tasks = [c._task for c in connections if c._task is not None]
        for c in connections:
            c._transport.abort()
        await asyncio.gather(*(c.lost for c in connections))
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._listener.wait_closed()
        self.refusals.flush()

    def stop(self) -> None:
        """Close every connection and the listener, and end the thread (any thread)."""
        if not self._thread.is_alive():
            return
        if hasattr(self, "_listener"):
            self._call(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()

    # -- requests (loop thread) -------------------------------------------

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

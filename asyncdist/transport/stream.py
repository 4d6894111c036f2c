"""One authenticated byte stream to one peer, driven by the event loop.

A :class:`Connection` owns a connected, non-blocking socket after its
handshake. It reads with ``recv_into`` straight into whatever view the
:class:`~asyncdist.wire.frames.FrameDecoder` names (the user's buffer for a large
matched payload) and writes with ``sendmsg`` from memoryviews of the user's
arrays, so neither direction copies a payload in user space.

Why raw ``add_reader``/``add_writer`` instead of an asyncio Transport: a
transport's ``write()`` copies what the kernel did not take (the selector
loop) or returns at once (uvloop), so "the buffer may be reused" could not
be told from "the bytes are queued". Here a send's future resolves when its
last byte is in the kernel, the moment torch's ``send`` may return.

A peer on the same host that can read this process's memory (:mod:`.cma`)
is sent large payloads by address (:meth:`Connection.send_message`,
:mod:`.by_memory`): it copies them out and answers with a DONE frame, which
completes the send. Frames to a peer on the same host go through a
shared-memory ring instead of the socket once both agree
(:meth:`Connection.use_rings`, :mod:`.shm_link`).

Invariants:

* Frames are written whole and in the order ``send_frame`` was called.
* A payload sent by address stays referenced until its DONE arrives or the
  connection ends; :meth:`Connection.drain` waits for those too, so a rank
  does not exit while a peer may still be reading its memory.
* Loop thread only; every callback runs on the loop.
* On any failure the connection calls ``on_lost`` exactly once, fails every
  pending send, and closes its socket. It never raises into the loop.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from collections import deque
from typing import Callable, NamedTuple

from ..errors import PeerLostError, ProtocolError
from ..wire.control import ControlFrame, Done, encode_control
from ..wire.frames import FrameDecoder, FrameSink, Header, encode_header
from ..wire.handshake import PeerMemoryReader
from . import cma, injection
from .by_memory import ByMemory, Fold
from .shm_link import ShmLink, ShmPoller

__all__ = ["Connection", "Fold"]

log = logging.getLogger("asyncdist.transport")

# Reads per readable event before yielding to other callbacks; bounds how
# long one busy peer can hold the loop (each read is at most one buffer).
_MAX_READS_PER_EVENT = 64
# Readable events drained after a failed write, before the peer is lost: a
# socket's receive buffer holds a few MiB, far less than this many reads.
_MAX_DRAIN_EVENTS = 1024
# libuv (under uvloop) stops watching a socket whose event carried an error:
# when a peer's last bytes and its reset arrive together, the reader runs once,
# reads the bytes, and is never told of the reset (checked on uvloop 0.23:
# asyncio's loop calls the reader again, with ECONNRESET). So under uvloop a
# short read does not end the event: one more read finds EAGAIN, or the
# reset. One recv per readable event (about 1 us), on uvloop only.
_READS_PAST_SHORT = ("uvloop",)
# sendmsg accepts at most IOV_MAX (1024 on Linux) buffers per call.
_MAX_IOV = 512


class _PendingWrite(NamedTuple):
    views: deque[memoryview]  # what the socket has not taken yet, consumed in place
    future: asyncio.Future  # resolved once the last view is in the kernel


class Connection:
    """A framed, authenticated stream to one peer (loop thread only).

    Args:
        loop: the loop that owns the socket.
        sock: a connected socket that passed the handshake.
        peer: the peer's global rank (for error messages).
        decoder: the frame decoder that receives this stream's bytes.
        on_lost: called once with the :class:`PeerLostError` when the stream
            ends or fails for any reason other than :meth:`close`.
        peer_memory: how to read the peer's memory (REMOTE payloads it sends
            us), None if this process cannot.
        peer_reads_me: whether the peer can read this process's memory, so
            that :meth:`send_message` may send by address.
        me: this process's rank (the source of the DONE frames it sends).

    Attributes:
        last_received, last_sent: loop time of the last bytes read from the
            peer and of the last frame queued for it (for the heartbeat).
        by_memory: the payloads sent to the peer by address and read from it
            (:class:`~asyncdist.transport.by_memory.ByMemory`).
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        peer: int,
        decoder: FrameDecoder,
        on_lost: Callable[[PeerLostError], None],
        peer_memory: PeerMemoryReader | None = None,
        peer_reads_me: bool = False,
        me: int = 0,
    ) -> None:
        sock.setblocking(False)
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self.peer = peer
        self._decoder = decoder
        self._on_lost = on_lost
        self._writes: deque[_PendingWrite] = deque()
        self._writer_armed = False
        self.by_memory = ByMemory(peer, peer_memory, self.send_frame, encode_control(Done(me)))
        self.peer_reads_me = peer_reads_me
        self._by_memory_from = cma.min_bytes()
        self._me = me
        self.rings: ShmLink | None = None  # the shared-memory rings, once offered (use_rings)
        self.closed = False
        self.last_received = self.last_sent = loop.time()
        self._reading = False  # inside _read: a failed write must not read again
        self._short_read_ends = not type(loop).__module__.startswith(_READS_PAST_SHORT)
        self.gate: injection.Gate | None = None  # a fault plan's, for this direction of the link
        if injection.INJECTOR is not None and (gate := injection.INJECTOR.gate(me, peer)) is not None:
            self.gate = gate
            injection.pass_through(self, gate)
        loop.add_reader(self._fd, self._read)

    def write_late(self, header: bytes, payload: memoryview | None) -> None:
        """Write a frame the gate held past this end's close, before the socket's
        held-back close: the kernel would have sent it before the FIN (best effort)."""
        try:
            self._sock.send(header + (bytes(payload) if payload is not None else b""))
        except OSError:
            pass

    # -- writing -----------------------------------------------------------

    def send_control(self, frame: ControlFrame) -> bool:
        """Send a control frame, best effort; False if closed."""
        try:
            self.send_frame(encode_control(frame), None)
        except PeerLostError:
            return False
        return True

    def send_frame(self, header: bytes, payload: memoryview | None) -> asyncio.Future | None:
        """Queue one frame (through the peer's ring, once it has one): ``None`` if it
        went out at once, else a future resolved when its last byte has. Raises
        PeerLostError if the connection is already closed."""
        self.last_sent = self._loop.time()
        rings = self.rings
        if rings is not None and rings.writing:
            return rings.write(header, payload)
        return self._send_on_socket(header, payload)

    def _send_on_socket(self, header: bytes, payload: memoryview | None) -> asyncio.Future | None:
        if self.closed:
            raise PeerLostError(f"connection to rank {self.peer} is closed", self.peer)
        views = deque((memoryview(header),))
        if payload is not None and payload.nbytes:
            views.append(payload)
        if not self._writes:
            try:
                self._write_views(views)
            except OSError as exc:
                self._write_failed(exc)
                raise PeerLostError(f"send to rank {self.peer} failed: {exc}", self.peer) from exc
            if not views:
                return None
        future = self._loop.create_future()
        self._writes.append(_PendingWrite(views, future))
        if not self._writer_armed:
            self._loop.add_writer(self._fd, self._on_writable)
            self._writer_armed = True
        return future

    def use_rings(self, sink: FrameSink, poller: ShmPoller, capacity: int, *, accept: bool) -> None:
        """Offer the peer a shared-memory ring of ``capacity`` bytes (0: none), whose
        frames go to ``sink``; write to the one it offers if ``accept`` (:mod:`.shm_link`)."""
        decoder = FrameDecoder(sink, max_payload=self._decoder.max_payload) if capacity else None
        self.rings = ShmLink(self.peer, self._me, decoder, poller, capacity, accept,
                              self._send_on_socket, self._broken, self._heard, self.by_memory.awaiting_done)
        self.rings.offer()

    def _heard(self) -> None:
        self.last_received = self._loop.time()

    @property
    def shares_memory(self) -> bool:
        """Whether frames go through a ring either way, or payloads are read from the peer."""
        return self.by_memory.peer_memory is not None or (self.rings is not None and (self.rings.writing or self.rings.reading))

    def send_message(self, header: Header, payload: memoryview | None) -> asyncio.Future | None:
        """Send one message: a large payload by address if the peer can read this
        process's memory, else inline. Returns and raises as :meth:`send_frame`
        (whose two lines it repeats: every message passes here)."""
        if payload is not None and payload.nbytes >= self._by_memory_from and self.peer_reads_me:
            return self.by_memory.send(self._loop, header, payload)
        self.last_sent = self._loop.time()
        rings = self.rings
        if rings is not None and rings.writing:
            return rings.write(encode_header(header), payload)
        return self._send_on_socket(encode_header(header), payload)

    def _write_views(self, views: deque[memoryview]) -> None:
        """Write as much of ``views`` as the kernel takes, dropping what was sent."""
        while views:
            batch = list(views)[:_MAX_IOV] if len(views) > _MAX_IOV else views
            try:
                sent = self._sock.sendmsg(batch)
            except (BlockingIOError, InterruptedError):
                return
            while sent:
                head = views[0]
                if sent >= head.nbytes:
                    sent -= head.nbytes
                    views.popleft()
                else:
                    views[0] = head[sent:]
                    sent = 0
            if views:
                return  # the kernel took less than offered: its buffer is full

    def _on_writable(self) -> None:
        try:
            while self._writes:
                pending = self._writes[0]
                self._write_views(pending.views)
                if pending.views:
                    return
                self._writes.popleft()
                if not pending.future.done():
                    pending.future.set_result(None)
        except OSError as exc:
            self._write_failed(exc)
            return
        self._loop.remove_writer(self._fd)
        self._writer_armed = False

    # -- reading -----------------------------------------------------------

    def _read(self) -> int:
        """Read what the kernel holds (up to a bound) into the decoder; the bytes
        read. The socket's reader (the loop ignores what it returns)."""
        decoder = self._decoder
        total = 0
        self._reading = True
        try:
            for _ in range(_MAX_READS_PER_EVENT):
                view = decoder.get_buffer()
                n = self._sock.recv_into(view)
                if n == 0:
                    self._lose(f"rank {self.peer} closed the connection", None)
                    return total
                total += n
                self.last_received = self._loop.time()
                if self.rings is not None and self.rings.reading:  # the ring holds what was written before these bytes
                    self.rings.drain()
                decoder.buffer_updated(n)
                if n < view.nbytes and self._short_read_ends:
                    return total  # drained what the kernel had
        except (BlockingIOError, InterruptedError):
            return total
        except OSError as exc:
            self._lose(f"connection to rank {self.peer} failed: {exc}", exc)
        except Exception as exc:  # a bug in a sink must not kill the loop
            self._broken(exc)
        finally:
            self._reading = False
        return total

    def _broken(self, exc: Exception) -> None:
        """The peer's frames (from the socket or the ring) could not be handled: drop it, saying why."""
        if isinstance(exc, PeerLostError):  # its process ended under a read of its memory
            self._lose(str(exc), exc)
        elif isinstance(exc, ProtocolError):
            log.error("rank %d broke the wire protocol: %s", self.peer, exc)
            self._lose(f"rank {self.peer} broke the wire protocol: {exc}", exc)
        else:
            log.error("error while handling data from rank %d", self.peer, exc_info=exc)
            self._lose(f"error while handling data from rank {self.peer}: {exc!r}", exc)

    # -- closing -----------------------------------------------------------

    def _write_failed(self, exc: OSError) -> None:
        """A write failed: the peer may have closed in order, with frames and its
        goodbye unread here (a root that sent its part and left). Read what the
        kernel holds first, so a BYE ends the connection in order; only then is
        the peer lost. Not from inside this connection's own read: its decoder
        is mid-frame."""
        for _ in range(_MAX_DRAIN_EVENTS):
            if self.closed or self._reading or not self._read():
                break
        self._lose(f"send to rank {self.peer} failed: {exc}", exc)

    def _lose(self, reason: str, cause: BaseException | None) -> None:
        if self.closed:
            return
        if self.rings is not None:
            self.rings.drain()  # what the peer wrote before its stream ended (its goodbye among it)
            if self.closed:
                return
        error = PeerLostError(reason, self.peer)
        error.__cause__ = cause
        self._shutdown(error)
        self._on_lost(error)

    def shutdown_write(self) -> None:
        """Send nothing more (a FIN after the queued frames); reading goes on."""
        if not self.closed:
            try:
                self._sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # the peer is gone already: reading will say so

    def discard_unread(self) -> None:
        """Read and drop what the kernel holds from the peer, so that closing
        sends a FIN after the last frames instead of a reset that could destroy them."""
        scratch = bytearray(64 * 1024)
        try:
            for _ in range(_MAX_READS_PER_EVENT):
                if self.closed or not self._sock.recv_into(scratch):
                    return
        except OSError:
            return

    def reset(self) -> None:
        """Close at once with a reset, as the kernel does for a killed process (tests)."""
        if not self.closed:
            try:
                self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
            self.close()

    def close(self, error: PeerLostError | None = None) -> None:
        """Close the socket at once; pending sends fail with ``error`` (by
        default a PeerLostError saying the connection was closed locally)."""
        if not self.closed:
            self._shutdown(error or PeerLostError(f"connection to rank {self.peer} was closed locally", self.peer))

    async def drain(self) -> None:
        """Wait until every queued frame has been handed to the kernel and
        every payload sent by memory has been read by the peer."""
        while self._writes and not self.closed:
            await asyncio.shield(self._writes[-1].future)
        while (awaiting := self.by_memory.awaiting_done) and not self.closed:
            await asyncio.shield(awaiting[-1][0])

    def _shutdown(self, error: PeerLostError) -> None:
        self.closed = True
        self._loop.remove_reader(self._fd)
        if self._writer_armed:
            self._loop.remove_writer(self._fd)
            self._writer_armed = False
        for pending in self._writes:
            if not pending.future.done():
                pending.future.set_exception(error)
        self._writes.clear()
        self.by_memory.fail(error)
        if self.rings is not None:
            self.rings.close()
        if self.gate is not None:  # the peer of a cut link sees the end only once it heals
            self.gate.fail(error)
            self.gate.close(self._close_socket)
        else:
            self._close_socket()

    def _close_socket(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass

"""The shared-memory side of one connection: a ring each way, rung over the socket.

A :class:`ShmLink` belongs to one :class:`~asyncdist.transport.stream.Connection`.
Once both ends agree, the frames the connection sends, messages and
control frames alike, go through the peer's :class:`~.shm_ring.ShmRing`
instead of the socket whenever they can (below), and keep the one order
they were sent in. The socket stays: it carries the agreement, the frames
that cannot go through the ring, the rare wake-up, and the end of the
stream (a peer that dies closes it, which is how its loss is noticed).

Agreement, per direction, all on the socket:

1. each end makes a ring for the peer to write and *offers* it
   (:class:`~asyncdist.wire.control.RingOffer`: its pid, the ring's
   descriptor, nonce and capacity);
2. the peer opens it and answers *accepted* (``RingAccepted``) as the last
   frame it writes to the socket before writing to the ring, or *refused*
   (``RingRefused``) if it cannot (another host, ``ASYNCDIST_SHM=0`` there,
   no ``/proc``);
3. the offering end reads the ring from the moment it reads "accepted",
   so nothing that came before on the socket is overtaken.

Only whole frames go into a ring, and only while the reader polls it. A
frame that does not fit in the room the reader has left, or finds the
reader not polling (it would have to be woken, which the socket's own
bytes do), goes on the socket instead, where the kernel holds it as it
would have without rings (also after this process ends): the writer marks
the switch in the ring, and sends every frame on the socket until one can
go to the ring again; then it sends *back* (``RingBack``, with the switch's
number) on the socket and writes to the ring. The reader reads the ring
up to the switch, then the socket up to *back*, then the ring again, so
the frames keep their order: whenever bytes come off the socket it first
reads the ring, which holds whatever was written before them.

A reader that stops polling says so, then looks at the ring once more: a
frame written by a writer that saw it polling is still taken. Only a
writer that finds, after writing, that the reader has just stopped rings
it (a ``Wake`` frame on the socket), and only if no earlier wake-up is
unanswered.

Loop thread only; nothing here blocks or raises into the loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Callable, Mapping, Sequence

from .. import settings
from ..errors import PeerLostError, ProtocolError
from ..wire.control import RingAccepted, RingBack, RingFrame, RingOffer, RingRefused, Wake, encode_control
from ..wire.frames import FrameDecoder
from . import cma
from .shm_ring import ShmRing, supported
from .spinning import may_spin

__all__ = ["ShmLink", "ShmPoller", "shm_ring_bytes", "SHM_ENV", "RING_BYTES_ENV"]

log = logging.getLogger("asyncdist.transport")

#: "0" turns the shared-memory rings off (default on, where :func:`supported`).
SHM_ENV = settings.name_of("shm")
#: Bytes of each ring (a power of two, at least 4096).
RING_BYTES_ENV = settings.name_of("shm_ring_bytes")
# Room for two frames of anything sent inline (payloads from 512 KiB are read
# from the sender's memory, :mod:`.cma`). Memory is taken as it is first written.
DEFAULT_RING_BYTES = 1 << 20
# The rings one rank reads take at most this much in all, by default: a rank
# of a large job gets smaller rings (at 64 ranks on one host, 128 KiB each).
_INBOUND_BUDGET_BYTES = 8 << 20
_MIN_DEFAULT_RING_BYTES = 16 * 1024


def shm_ring_bytes(world_size: int = 2, environ: Mapping[str, str] | None = None) -> int:
    """The capacity of the ring each rank offers each peer; 0: no rings.

    By default :data:`DEFAULT_RING_BYTES`, less where ``world_size`` ranks'
    rings would exceed a budget per rank.

    Raises:
        ValueError: ``ASYNCDIST_SHM_RING_BYTES`` is not a power of two of at
            least 4096.
    """
    read = settings.current() if environ is None else settings.Settings.from_environ(environ)
    if not supported() or not read.shm:
        return 0
    if read.shm_ring_bytes is None:
        fair = _INBOUND_BUDGET_BYTES // max(world_size - 1, 1)
        return max(_MIN_DEFAULT_RING_BYTES, min(DEFAULT_RING_BYTES, 1 << (fair.bit_length() - 1)))
    return read.shm_ring_bytes


class ShmPoller:
    """Reads every ring of one rank each turn of the loop, for ``spin``
    seconds after the last traffic, so that frames arriving meanwhile are
    taken without a wake-up; then tells the writers to ring again and stops.

    A rank whose ``spin`` is 0 (the ranks on its host outnumber the cores,
    or the launcher did not say) offers no rings: a ring never polled needs
    a wake-up on the socket for each frame, which costs what sending the
    frame there does. It still writes to the rings its peers offer.
    """

    __slots__ = ("_loop", "spin", "_links", "_busy", "_until", "_handle")

    def __init__(self, loop: asyncio.AbstractEventLoop, spin: float) -> None:
        self._loop = loop
        self.spin = spin
        self._links: list[ShmLink] = []
        self._busy = False  # traffic since the last look: polling goes on
        self._until = 0.0
        self._handle: asyncio.Handle | None = None

    def add(self, link: ShmLink) -> None:
        """Read ``link``'s ring too; a new ring is traffic (its writer may be writing now)."""
        self._links.append(link)
        link.set_polling(self._handle is not None)
        self.activity()

    def remove(self, link: ShmLink) -> None:
        if link in self._links:
            self._links.remove(link)

    def activity(self) -> None:
        """Something was sent, read or posted: look at the rings for a while
        (unless this thread may not spin: :func:`~.spinning.may_spin`)."""
        if not self.spin:
            return
        self._busy = True
        if self._handle is None and self._links and may_spin():
            for link in self._links:
                link.set_polling(True)
            self._handle = self._loop.call_soon(self._poll)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _poll(self) -> None:
        links = self._links
        got = sum(link.drain() for link in links)
        now = time.monotonic()
        if got or self._busy:
            self._busy = False
            self._until = now + self.spin
        # While frames come, or idle but not in a thread that runs the loop for callers
        # elsewhere, nor while a peer copies a payload out of this process with two
        # threads (:mod:`.cma`): spinning would take one of their cores.
        if now < self._until and (got or (may_spin() and not any(link.copied_by_two_threads() for link in links))):
            if not got:
                os.sched_yield()  # a runnable peer on this core (the writer, perhaps) goes first
            self._handle = self._loop.call_soon(self._poll)
            return
        for link in links:
            link.set_polling(False)
        if sum(link.drain() for link in links) and may_spin():  # written before the writers saw it stop
            for link in links:
                link.set_polling(True)
            self._until = now + self.spin
            self._handle = self._loop.call_soon(self._poll)
        else:
            self._handle = None


class ShmLink:
    """The rings of one connection, and their agreement (see the module doc).

    Args:
        peer: the peer's rank (for messages).
        me: this rank (the source of its RING and WAKE frames).
        decoder: where the frames read from the ring go (a second decoder
            over the connection's sink: the socket's may be mid-frame).
        poller: the rank's poller.
        capacity: bytes of the ring offered to the peer; 0 (with no
            decoder): none is offered.
        accept: whether to write to the ring the peer offers.
        send_on_socket: sends a frame (header bytes, payload) on the socket,
            past the ring, as ``Connection.send_frame`` does; raises
            PeerLostError once it is closed.
        fail: ends the connection for an error in the frames read.
        heard: called whenever bytes were read from the ring (liveness).
        copying: the (future, payload) pairs of the payloads the peer is
            reading out of this process's memory (the connection's, :mod:`.cma`).
    """

    def __init__(
        self,
        peer: int,
        me: int,
        decoder: FrameDecoder | None,
        poller: ShmPoller,
        capacity: int,
        accept: bool,
        send_on_socket: Callable[[bytes, memoryview | None], asyncio.Future | None],
        fail: Callable[[Exception], None],
        heard: Callable[[], None],
        copying: Sequence[tuple[asyncio.Future, memoryview]],
    ) -> None:
        self.peer = peer
        self._me = me
        self._decoder = decoder
        self._send_on_socket = send_on_socket
        self._fail = fail
        self._heard = heard
        self._copying = copying
        self._poller = poller
        self._capacity = capacity
        self._accept = accept
        self._in: ShmRing | None = None  # the ring the peer writes: read once accepted
        self._offered_fd = -1  # its memory's descriptor, until the peer opened it
        self.reading = False
        self._out: ShmRing | None = None  # the peer's ring, which this rank writes
        #: Whether frames to the peer go through its ring (its ring is attached).
        self.writing = False
        self._switched = 0  # the switch to the socket this rank's frames are under (0: none)
        self._draining = False
        self._wake = encode_control(Wake(me))

    # -- agreement ---------------------------------------------------------

    def offer(self) -> None:
        """Make the ring the peer will write and offer it (on the socket).

        Raises:
            PeerLostError: the socket is closed.
        """
        if not self._capacity:
            return
        try:
            self._in, self._offered_fd, nonce = ShmRing.create(self._capacity)
        except OSError as exc:
            log.info("rank %d: no shared-memory ring for rank %d: %s", self._me, self.peer, exc)
            return
        self._send(RingOffer(self._me, os.getpid(), self._offered_fd, nonce, self._capacity))

    def on_ring_frame(self, frame: RingFrame) -> None:
        """The peer offered a ring, answered this rank's offer, or writes to the ring again."""
        if isinstance(frame, RingOffer):
            self._open_peer_ring(frame)
        elif isinstance(frame, RingAccepted) and self._in is not None and not self.reading:
            self._close_offered_fd()
            self.reading = True
            self._poller.add(self)
            self.drain()  # what the peer wrote before its answer was read
        elif isinstance(frame, RingBack) and self._in is not None and self.reading:
            self._in.resume(frame.switch)
            self.drain()
        elif isinstance(frame, RingRefused):
            self._close_offered_fd()
            if self._in is not None and not self.reading:
                self._in.close()
                self._in = None
        else:
            raise ProtocolError(f"rank {self.peer} sent a ring frame this rank cannot use now: {frame}")

    def _open_peer_ring(self, offer: RingOffer) -> None:
        if not self._accept:
            self._send(RingRefused(self._me))
            return
        try:
            ring = ShmRing.attach(offer.pid, offer.fd, offer.nonce, offer.capacity)
        except (OSError, ValueError) as exc:
            log.debug("rank %d cannot write rank %d's ring: %s", self._me, self.peer, exc)
            self._send(RingRefused(self._me))
            return
        self._send(RingAccepted(self._me))  # the last frame on the socket before the ring's
        self._out, self.writing = ring, True

    def _send(self, frame: RingFrame) -> None:
        self._send_on_socket(encode_control(frame), None)

    def _close_offered_fd(self) -> None:
        if self._offered_fd >= 0:
            os.close(self._offered_fd)
            self._offered_fd = -1

    # -- writing -----------------------------------------------------------

    def write(self, header: bytes, payload: memoryview | None) -> asyncio.Future | None:
        """Send one frame: through the ring if it fits, else on the socket (see
        the module doc). The result is ``Connection.send_frame``'s: ``None``, or
        a future resolved when the payload may be reused."""
        ring = self._out
        assert ring is not None, "write() only while writing"
        self._poller.activity()
        size = len(header) + (0 if payload is None else payload.nbytes)
        if not ring.reader_polls() or not ring.fits(size) or (self._switched and not ring.can_switch_again()):
            if not self._switched:
                self._switched = ring.switch()
            return self._send_on_socket(header, payload)
        if self._switched:
            self._send(RingBack(self._me, self._switched))  # the socket's last frame before the ring's again
            self._switched = 0
        ring.put(memoryview(header))
        if payload is not None and payload.nbytes:
            ring.put(payload)
        ring.publish()
        if ring.wake_needed():
            self._ring_peer()
        return None

    # -- reading -----------------------------------------------------------

    def on_wake(self) -> None:
        """The peer rang: read the ring."""
        if self._in is not None and self.reading:
            self._in.acknowledge_wake()
            self.drain()

    def copied_by_two_threads(self) -> bool:
        """Whether the peer is reading a payload out of this process with two threads now."""
        copying = self._copying
        return bool(copying) and copying[-1][1].nbytes >= cma.SPLIT_READ_BYTES

    def set_polling(self, polling: bool) -> None:
        if self._in is not None:
            self._in.set_polling(polling)

    def drain(self) -> int:
        """Hand what the ring holds to the decoder; the bytes read."""
        ring, decoder = self._in, self._decoder
        if ring is None or decoder is None or not self.reading or self._draining:
            return 0
        available = ring.readable()
        if not available:
            return 0
        self._draining = True
        total = 0
        try:
            while available:
                taken = ring.get(decoder.get_buffer(), available)
                available -= taken
                total += taken
                decoder.buffer_updated(taken)
                if self._in is None:
                    return total  # a frame's handler closed the connection
                if not available:
                    available = ring.readable()
        except Exception as exc:  # a bug in a sink must not kill the loop
            self._fail(exc)
            return total
        finally:
            self._draining = False
        self._heard()
        self._poller.activity()
        return total

    def _ring_peer(self) -> None:
        try:
            self._send_on_socket(self._wake, None)
        except PeerLostError:
            pass  # the stream's end is being reported already

    # -- closing -----------------------------------------------------------

    def close(self) -> None:
        """Let go of both rings."""
        self._poller.remove(self)
        self._close_offered_fd()
        self.reading = False
        for ring in (self._in, self._out):
            if ring is not None:
                ring.close()
        self._in = self._out = None
        self.writing = False

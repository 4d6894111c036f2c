"""The per-rank runtime: connections to every peer, message matching, failures.

One :class:`Engine` per rank (per process, or per simulated rank in a
one-loop test world). It knows ranks, contexts and tags, never group names
or collectives. It owns:

* one :class:`~asyncdist.transport.stream.Connection` per peer (through a
  shared-memory ring to a peer on this host); the
  :class:`~asyncdist.transport.mesh.Mesh` listens, accepts (strangers are
  refused there) and dials, the higher rank of each pair dialing the lower;
* the :class:`~asyncdist.engine.mailbox.Mailbox`: receives and unexpected
  messages, and a :class:`~asyncdist.engine.mailbox.PeerInbox` per connection
  that routes each payload as its header arrives;
* failure propagation: when a peer's stream ends, every receive that depends
  on that peer fails with :class:`PeerLostError`, now and later, and every
  send to it fails too. Peers not involved are unaffected. A peer that goes
  silent without closing its stream is found by the
  :class:`~asyncdist.transport.heartbeat.Heartbeat` and lost the same way.

Loop thread only. ``send`` and ``post_recv`` start the operation and return
a future; nothing here blocks.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Callable, Iterable, Mapping

from . import closing
from .abort import abort_frame, error_from_abort
from .connecting import Arrivals, wait_for_peers
from .deadlines import Deadlines
from .faults import Faults
from ..flight import Flight
from ..buffers.host import HostBuffer
from ..errors import AsyncDistError, ClosedError, HandshakeError, PeerLostError
from ..rendezvous.waiting import WaitReports
from ..wire.handshake import HANDSHAKE_SECONDS, Identity, PeerAccess
from .losses import Losses, goodbye
from .mailbox import Mailbox, PeerInbox
from .matching import Fold, PostedRecv
from ..transport.heartbeat import Heartbeat, HeartbeatConfig
from ..transport.mesh import Mesh
from ..transport.shm_link import ShmPoller, shm_ring_bytes
from ..transport.spinning import spin_seconds
from ..transport.stream import Connection
from ..wire import control
from ..wire.frames import DEFAULT_MAX_PAYLOAD_BYTES, FrameDecoder, Header

__all__ = ["Engine"]

log = logging.getLogger("asyncdist.engine.engine")


class Engine:
    """Connections, matching and failure propagation for one rank.

    Args:
        me: this rank's identity (job id, rank, world size, secret).
        max_payload: the largest message accepted from a peer, in bytes.
        handshake_timeout: seconds an incoming connection may take to
            authenticate before it is dropped.
        heartbeat: ping and silence settings (None: from the environment,
            see :mod:`asyncdist.transport.heartbeat`).
    """

    def __init__(
        self,
        me: Identity,
        *,
        max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES,
        handshake_timeout: float = HANDSHAKE_SECONDS,
        heartbeat: HeartbeatConfig | None = None,
    ) -> None:
        self.me = me
        self.rank = me.rank
        self.world_size = me.world_size
        self._max_payload = max_payload
        self._mailbox = Mailbox(me.rank)
        #: The unexpected messages by (ctx, src, tag), read only: empty in the
        #: common case, which a caller tests before asking for any of them.
        self.unexpected = self._mailbox.unexpected
        #: The calls failed here and the contexts revoked, read only: both empty
        #: in the common case, which a caller tests before asking :meth:`call_error`.
        self.failed_calls, self.revoked_contexts = self._mailbox.aborted, self._mailbox.revoked
        self._connections: dict[int, Connection] = {}
        self._losses = Losses()
        self._inboxes: dict[int, PeerInbox] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._mesh = Mesh(me, handshake_timeout=handshake_timeout, attach=self._attach, wanted=self._wants)
        #: Control frames of groups, loss watchers, exclusion, revoked contexts (:mod:`.faults`).
        self.faults = Faults(me.rank, self._mailbox, self._connections, self._peer_lost)
        self._heartbeat = Heartbeat(me.rank, heartbeat or HeartbeatConfig.from_env(), self._connections, self._silent)
        self._arrivals = Arrivals(self._connections, self._losses)  # woken by each connection attached, or loss
        #: The context :meth:`new_context` returns next (counted alike on every rank).
        self.next_context = 0
        self._abort_watchers: dict[int, Callable[[int, AsyncDistError], None]] = {}
        self._peers_gone: asyncio.Future | None = None  # set once closing and no connection is left
        self.closed = False
        #: The signal this process is ending by (0: none), told to the peers in
        #: the BYE frame's tag so that they word the loss by its cause.
        self.farewell_signal = 0
        self.address: tuple[str, int] | None = None
        self.flight = Flight(me, self._connections)  #: recorder, dumps, counters, hang questions
        self.deadlines = Deadlines()  #: the one timer of this rank's operations
        self._ring_bytes = shm_ring_bytes(me.world_size)  # of each peer's shared-memory ring (0: no rings)
        self._rings: ShmPoller | None = None  # polls them (from listen())

    # -- setup -------------------------------------------------------------

    async def listen(self, host: str, listener: socket.socket | None = None) -> tuple[str, int]:
        """Listen on an ephemeral port of ``host`` (or ``listener``); return (host, port) to publish."""
        self._loop = self.flight.dumps.loop = asyncio.get_running_loop()
        self.deadlines.bind(self._loop)
        self._rings = ShmPoller(self._loop, spin_seconds())
        self.address = await self._mesh.listen(host, listener)
        self._heartbeat.start()
        return self.address

    async def connect(
        self,
        addresses: Mapping[int, tuple[str, int]],
        timeout: float,
        reports: WaitReports | None = None,
        peers: Iterable[int] | None = None,
    ) -> None:
        """Dial the lower ranks of ``peers`` (None: the job's) at ``addresses``; wait
        until the higher ones dialed in. ``reports``: the rendezvous's, to log the
        ranks not connected yet whenever one is due (:mod:`.connecting`). Raises
        RendezvousError after ``timeout`` s, PeerLostError or HandshakeError when a
        lower rank cannot be reached."""
        wanted = set(range(self.world_size) if peers is None else peers) - {self.rank}
        dials = (self._mesh.dial(peer, *addresses[peer]) for peer in sorted(wanted) if peer < self.rank)

        def unconnected() -> list[int]:
            return sorted(wanted - self._connections.keys())

        await wait_for_peers(self.rank, asyncio.gather(*dials, self._arrivals.all_of(wanted)), timeout, unconnected,
                             reports)

    @property
    def heartbeat_timeout(self) -> float:
        """Seconds of silence after which a peer is counted lost (0: never)."""
        return self._heartbeat.config.timeout

    async def reach(self, addresses: Mapping[int, tuple[str, int]], peers: Iterable[int], timeout: float) -> list[int]:
        """Dial the lower ranks of ``peers`` at ``addresses`` and wait for the higher
        ones to dial in, until each is connected or lost, or ``timeout`` seconds (of
        the loop's clock) pass; return those not connected then, sorted. Unlike
        :meth:`connect`, one failure stops nothing: a peer that cannot be dialed is
        expelled (counted lost), and the others are still waited for (a grow's
        connections, which its agreement then judges)."""
        wanted = sorted(set(peers) - {self.rank})

        async def dial(peer: int) -> None:
            try:
                await self._mesh.dial(peer, *addresses[peer])
            except (PeerLostError, HandshakeError) as exc:
                if not self.is_lost(peer):
                    self.faults.expel(peer, f"rank {self.rank} could not reach it: {exc}")

        return await self._arrivals.settle(wanted, [dial(peer) for peer in wanted if peer < self.rank], timeout)

    def widen(self, world_size: int, next_context: int) -> None:
        """Accept the ids below ``world_size`` (joined by a grow); count contexts from ``next_context``."""
        self.me = self._mesh.me = Identity(self.me.job_id, self.rank, world_size, self.me.secret)
        self.world_size, self.next_context = world_size, next_context
        self.flight.widen(world_size)

    def _attach(self, peer: int, sock: socket.socket, access: PeerAccess) -> None:
        assert self._loop is not None, "listen() first"
        inbox = PeerInbox(self._mailbox, peer, self._control_frame, self.flight.counters)
        decoder = FrameDecoder(inbox, max_payload=self._max_payload)
        self._inboxes[peer] = inbox
        self._connections[peer] = inbox.connection = Connection(
            self._loop,
            sock,
            peer,
            decoder,
            lambda error: self._peer_lost(peer, error),
            peer_memory=access.peer_memory,
            peer_reads_me=access.peer_reads_me,
            me=self.rank,
        )
        if self._rings is not None:  # no ring offered if never polled: each frame would need a wake-up
            inbox.connection.use_rings(inbox, self._rings, self._ring_bytes if self._rings.spin else 0, accept=self._ring_bytes > 0)
        self._arrivals.changed()

    def _wants(self, peer: int) -> bool:
        return not (peer in self._connections or peer in self._losses or self.closed)

    def new_context(self) -> int:
        """Return a fresh context id (the same on every rank that calls in the same order)."""
        ctx = self.next_context
        self.next_context += 1
        return ctx

    # -- operations ----------------------------------------------------------

    def send(self, dst: int, header: Header, payload: memoryview | None) -> asyncio.Future | None:
        """Start sending one message; ``None`` means it is already in the kernel.

        The future resolves when ``payload`` may be reused: its last byte is
        in the kernel, or the peer has copied it out of this process's memory.

        Raises:
            PeerLostError: ``dst`` is lost or not connected.
            ClosedError: the engine is closed.
        """
        if (connection := self._connections.get(dst)) is None:
            raise self._unreachable(dst)
        if self.faults.refusing and (refused := self.faults.send_error(header.ctx)) is not None:
            raise refused  # one attribute test per message; the rest only after a revoke or an exclusion
        counters = self.flight.counters  # counted here, not by a call: every message passes
        counters.sent_bytes[dst] += header.nbytes
        counters.sent_messages[dst] += 1
        return connection.send_message(header, payload)

    def post_recv(
        self,
        ctx: int,
        src: int | None,
        tag: int,
        buf: HostBuffer,
        sources: frozenset[int] = frozenset(),
        op: str | None = None,
        fold: Fold | None = None,
    ) -> PostedRecv:
        """Start a receive; its ``future`` resolves to the matched message's Header.

        ``src=None`` receives from any of ``sources``. With ``op``, a message
        sent from within another operation fails the receive with
        :class:`CollectiveMismatchError` instead of being delivered. With
        ``fold``, the message is combined into ``buf`` instead of written
        over it (see :class:`~asyncdist.engine.matching.PostedRecv`).
        """
        if self.closed:
            raise ClosedError(f"rank {self.rank}: the process group is closed")
        if self.faults.excluded is not None:
            raise self.faults.excluded
        assert self._loop is not None
        recv = PostedRecv(ctx, src, tag, buf, asyncio.Future(loop=self._loop), sources, op, fold)
        self._mailbox.post(recv, self._losses.fatal_for(recv) if self._losses.errors else None)
        if (rings := self._rings) is not None and rings.spin:
            rings.activity()  # its message may come through a ring: look for a while
        return recv

    def watch(
        self,
        ctx: int,
        *,
        unmatched: Callable[[Header], bool] | None = None,
        aborted: Callable[[int, AsyncDistError], None] | None = None,
    ) -> None:
        """Hooks of a group's calls into context ``ctx`` (loop thread).

        Args:
            unmatched: asked about each message of ``ctx`` that no receive
                takes, as it arrives: True keeps it queued, False drops it
                (see :meth:`Mailbox.screen`).
            aborted: told of each ABORT for a call (tag) of ``ctx`` that had
                not failed here, also one for a call that has finished here.
        """
        if unmatched is not None:
            self._mailbox.screen(ctx, unmatched)
        if aborted is not None:
            self._abort_watchers[ctx] = aborted

    def take_queued(self, ctx: int, tag: int) -> list[Header]:
        """Remove and return the headers of the unexpected messages of call (ctx, tag)."""
        return self._mailbox.take_queued(ctx, tag)

    def call_error(self, ctx: int, tag: int) -> AsyncDistError | None:
        """The error call (ctx, tag) failed with here (an ABORT, a detected mismatch), or None."""
        if not (self.failed_calls or self.revoked_contexts):  # the common case, without a call
            return None
        return self._mailbox.call_error(ctx, tag)

    def fail_call(self, ctx: int, tag: int, error: AsyncDistError) -> None:
        """Fail call (ctx, tag)'s receives with ``error``, now and later; drop its messages."""
        self._mailbox.fail_call(ctx, tag, error)

    def send_abort(self, ranks: Iterable[int], ctx: int, tag: int, error: BaseException) -> None:
        """Tell ``ranks`` that call (ctx, tag) failed here with ``error`` (best effort)."""
        frame = abort_frame(self.rank, ctx, tag, error)
        for rank in ranks:
            if (connection := self._connections.get(rank)) is not None:
                connection.send_control(frame)

    def is_lost(self, rank: int, *, crashed: bool = False) -> bool:
        """Whether ``rank`` crashed or was expelled, or (unless ``crashed``) left in order."""
        return rank in self._losses and not (crashed and self._losses.left(rank))

    def _silent(self, rank: int, error: PeerLostError) -> None:  # the heartbeat's verdict; it may be only paused
        self.faults.expel(rank, f"rank {self.rank} heard nothing from it within the heartbeat timeout", error)

    def stall(self, seconds: float) -> None:
        """Count this rank as stopped for ``seconds`` (a fault plan's pause in one loop,
        :mod:`asyncdist.testing.injector`): its heartbeat declares nobody lost until
        one tick after it resumes, as a stopped process's first late tick would not."""
        assert self._loop is not None, "listen() first"
        self._heartbeat.stalled_until = self._loop.time() + seconds + self._heartbeat.period

    def cancel_recv(self, recv: PostedRecv) -> bool:
        """Withdraw a receive that has not matched yet; True if it was withdrawn."""
        return self._mailbox.cancel(recv)

    def take_stale(self, ctx: int, below_tag: int) -> Header | None:
        """Consume an unmatched message of ``ctx`` tagged below ``below_tag``; its header, or None."""
        return self._mailbox.take_stale(ctx, below_tag)

    def by_memory(self, rank: int, *, sending: bool) -> bool:
        """Whether payloads to (``sending``) or from ``rank`` go by memory reads (not once it is gone)."""
        if (connection := self._connections.get(rank)) is None:
            return False
        return connection.peer_reads_me if sending else connection.by_memory.peer_memory is not None

    def same_host(self, rank: int) -> bool:
        """Whether ``rank`` is linked to this one by shared memory (a ring, or memory reads)."""
        return (connection := self._connections.get(rank)) is not None and (connection.peer_reads_me or connection.shares_memory)

    def peer_error(self, rank: int) -> PeerLostError | None:
        """The error that ended the stream to ``rank``, if it has ended."""
        return self._losses.error(rank)

    # -- control frames (from each connection's PeerInbox) ------------------

    def _control_frame(self, rank: int, frame: control.ControlFrame) -> None:
        """A control frame from ``rank``; a Ping's arrival was its point."""
        if isinstance(frame, (control.Wake, control.RingOffer, control.RingAccepted, control.RingRefused, control.RingBack)):
            if (rings := self._connections[rank].rings if rank in self._connections else None) is not None:
                rings.on_wake() if isinstance(frame, control.Wake) else rings.on_ring_frame(frame)
        elif isinstance(frame, control.Bye):
            self._peer_lost(rank, PeerLostError(goodbye(rank, frame.signal), rank), orderly=True)
        elif isinstance(frame, control.Abort):
            error = error_from_abort(frame)
            failed_here = self._mailbox.call_error(frame.ctx, frame.tag) is not None
            self.fail_call(frame.ctx, frame.tag, error)
            if not failed_here:  # a call failed here has dumped already
                self.flight.aborted(rank, error)
            watcher = self._abort_watchers.get(frame.ctx)
            if watcher is not None and not failed_here:
                watcher(frame.tag, error)
        elif isinstance(frame, control.Done):
            connection = self._connections.get(rank)
            if connection is not None:  # else: it came after the peer's goodbye, in the same read
                connection.by_memory.done()
        elif isinstance(frame, (control.Revoke, control.Agree, control.Expel)):
            self.faults.frame(rank, frame)
        elif isinstance(frame, (control.Where, control.Here)):
            self.flight.control(rank, frame)

    # -- failures --------------------------------------------------------------

    def _unreachable(self, rank: int) -> Exception:
        if self.closed:
            return ClosedError(f"rank {self.rank}: the process group is closed")
        return self.faults.excluded or self._losses.error(rank) or PeerLostError(f"rank {self.rank} has no connection to rank {rank}", rank)

    def _peer_lost(self, rank: int, error: PeerLostError, orderly: bool = False) -> None:
        """Fail everything that depends on ``rank``; called once per peer.

        ``orderly``: the peer said goodbye (not worth a warning by itself).
        """
        if not self._losses.record(rank, error, orderly=orderly):
            return
        self.flight.peer_lost(rank, error, orderly=orderly, closing=self.closed)
        connection = self._connections.pop(rank, None)
        if connection is not None:
            connection.close(error)
        if not self.closed:
            log.log(logging.INFO if orderly else logging.WARNING, "rank %d lost rank %d: %s", self.rank, rank, error)
        if (inbox := self._inboxes.pop(rank, None)) is not None:
            inbox.lose(error)
        self._mailbox.fail_dependents(rank, self._losses.fatal_for, error)
        self.faults.lost(rank)
        self._arrivals.changed()
        if (gone := self._peers_gone) is not None and not self._connections and not gone.done():
            gone.set_result(None)

    async def close(self) -> None:
        """Say goodbye to every peer, flush what was sent, wait (bounded) until
        each has read the goodbye (:mod:`.closing`), close every socket.

        Receives still waiting fail with :class:`ClosedError`.
        """
        if self.closed:
            return
        self.closed = True
        # First: while the goodbyes drain, a peer closes its end, and that loss
        # must not be what this rank's own receives report.
        self._mailbox.fail_all(ClosedError(f"rank {self.rank}: the process group was destroyed"))
        await self._heartbeat.stop()
        self.deadlines.stop()
        if self._rings is not None:
            self._rings.stop()
        bye = control.encode_control(control.Bye(self.rank, self.farewell_signal))
        await closing.flush_goodbye(self.rank, self._connections.values(), bye)
        if self._connections:
            self._peers_gone = asyncio.get_running_loop().create_future()
            await closing.linger(self._connections.values(), self._peers_gone)
        await self.flight.close()
        for rank in list(self._connections):
            self._peer_lost(rank, PeerLostError(f"rank {self.rank} closed its connection to rank {rank}", rank))
        await self._mesh.close()
        self._arrivals.close()


"""The per-rank runtime: connections to every peer, message matching, failures.

One :class:`Engine` per rank (per process, or per simulated rank in a
one-loop test world). It knows ranks, contexts and tags, never group names
or collectives. It owns:

* one :class:`~asyncdist.transport.stream.Connection` per peer; the
  :class:`~asyncdist.transport.mesh.Mesh` listens, accepts (strangers are
  refused there) and dials, the higher rank of each pair dialing the lower;
* the :class:`~asyncdist.matching.Matcher`: a payload whose header matches a
  posted receive is read straight into that receive's buffer; otherwise it
  lands in an engine-owned buffer and is copied once when its receive comes;
* routing the payloads a same-host peer sends by address (the connection
  chooses the path and copies them, :mod:`~asyncdist.transport.cma`);
* failure propagation: when a peer's stream ends, every receive that depends
  on that peer fails with :class:`PeerLostError`, now and later, and every
  send to it fails too. Peers that are not involved are unaffected. A peer
  that goes silent without closing its stream is found by the
  :class:`~asyncdist.transport.heartbeat.Heartbeat` and lost the same way.

Loop thread only. ``send`` and ``post_recv`` are plain functions that start
the operation and return a future; nothing here blocks.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections import OrderedDict
from typing import Iterable, Mapping

import numpy as np

from .abort import abort_header, error_from_abort
from .buffers import HostBuffer
from .errors import (
    AsyncDistError,
    ClosedError,
    PeerLostError,
    ProtocolError,
    RendezvousError,
)
from .handshake import Identity, PeerAccess
from .losses import Losses
from .matching import Fold, Inbound, Matcher, PostedRecv, misfit
from .scratch import pool
from .transport.heartbeat import Heartbeat, HeartbeatConfig
from .transport.mesh import Mesh
from .transport.stream import Connection
from .wire import DEFAULT_MAX_PAYLOAD_BYTES, FrameDecoder, Header, Kind, encode_header

__all__ = ["Engine"]

log = logging.getLogger("asyncdist.engine")

# How long close() waits for queued frames to reach the kernel.
_CLOSE_DRAIN_SECONDS = 10.0
# Aborted calls remembered (so a receive posted after the ABORT fails too).
_MAX_ABORTED_CALLS = 4096


class _PeerSink:
    """Routes one connection's decoded frames into the engine."""

    __slots__ = ("engine", "rank", "current", "staged")

    def __init__(self, engine: Engine, rank: int) -> None:
        self.engine = engine
        self.rank = rank
        self.current: PostedRecv | Inbound | None = None  # the payload being read
        self.staged: np.ndarray | None = None  # where it is read, for a folding receive

    def payload_buffer(self, header: Header) -> memoryview:
        return self.engine._start_payload(self, header)

    def frame_received(self, header: Header, payload: memoryview) -> None:
        self.engine._finish_frame(self, header)


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
        handshake_timeout: float = 30.0,
        heartbeat: HeartbeatConfig | None = None,
    ) -> None:
        self.me = me
        self.rank = me.rank
        self.world_size = me.world_size
        self._max_payload = max_payload
        self._matcher = Matcher()
        self._connections: dict[int, Connection] = {}
        self._losses = Losses()
        self._sinks: dict[int, _PeerSink] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._mesh = Mesh(me, handshake_timeout=handshake_timeout, attach=self._attach, wanted=self._wants)
        self._heartbeat = Heartbeat(me.rank, heartbeat or HeartbeatConfig.from_env(), self._connections, self._peer_lost)
        self._all_connected: asyncio.Future | None = None
        self._aborted: OrderedDict[tuple[int, int], AsyncDistError] = OrderedDict()
        self._next_context = 0
        self.closed = False
        self.address: tuple[str, int] | None = None

    # -- setup -------------------------------------------------------------

    async def listen(self, host: str) -> tuple[str, int]:
        """Listen on an ephemeral port of ``host``; return (host, port) to publish."""
        self._loop = asyncio.get_running_loop()
        self._all_connected = self._loop.create_future()
        self.address = await self._mesh.listen(host)
        self._heartbeat.start()
        if self.world_size == 1:
            self._all_connected.set_result(None)
        return self.address

    async def connect(self, addresses: Mapping[int, tuple[str, int]], timeout: float) -> None:
        """Dial every lower rank and wait until every higher rank dialed in.

        Raises:
            RendezvousError: not all peers connected within ``timeout`` seconds.
            PeerLostError, HandshakeError: a lower rank could not be reached.
        """
        assert self._all_connected is not None, "listen() first"
        dials = (self._mesh.dial(peer, *addresses[peer]) for peer in range(self.rank))
        try:
            await asyncio.wait_for(asyncio.gather(*dials, asyncio.shield(self._all_connected)), timeout)
        except asyncio.TimeoutError:
            missing = sorted(set(range(self.world_size)) - set(self._connections) - {self.rank})
            raise RendezvousError(
                f"rank {self.rank}: ranks {missing} did not connect within {timeout:g} s"
            ) from None

    def _attach(self, peer: int, sock: socket.socket, access: PeerAccess) -> None:
        assert self._loop is not None
        sink = _PeerSink(self, peer)
        decoder = FrameDecoder(sink, max_payload=self._max_payload)
        self._sinks[peer] = sink
        self._connections[peer] = Connection(
            self._loop,
            sock,
            peer,
            decoder,
            lambda error: self._peer_lost(peer, error),
            peer_memory=access.peer_memory,
            peer_reads_me=access.peer_reads_me,
            me=self.rank,
        )
        if len(self._connections) == self.world_size - 1 and not self._all_connected.done():
            self._all_connected.set_result(None)

    def _wants(self, peer: int) -> bool:
        return not (peer in self._connections or peer in self._losses or self.closed)

    def new_context(self) -> int:
        """Return a fresh context id (the same on every rank that calls in the same order)."""
        ctx = self._next_context
        self._next_context += 1
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
        connection = self._connections.get(dst)
        if connection is None:
            raise self._unreachable(dst)
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
        over it (see :class:`~asyncdist.matching.PostedRecv`).
        """
        if self.closed:
            raise ClosedError(f"rank {self.rank}: the process group is closed")
        assert self._loop is not None
        recv = PostedRecv(ctx, src, tag, buf, self._loop.create_future(), sources, op, fold)
        inbound = self._matcher.take_unexpected(ctx, src, tag)
        if inbound is not None:
            self._deliver_unexpected(inbound, recv)
            return recv
        failed = self._losses.fatal_for(recv) or self._aborted.get((ctx, tag))
        if failed is not None:
            _fail(recv.future, failed)
            return recv
        self._matcher.post(recv)
        return recv

    def fail_call(self, ctx: int, tag: int, error: AsyncDistError) -> None:
        """Mark call (ctx, tag) failed: its receives fail with ``error``, now and
        later, and its messages, queued or still to come, are dropped."""
        if (ctx, tag) in self._aborted:
            return
        self._aborted[(ctx, tag)] = error
        if len(self._aborted) > _MAX_ABORTED_CALLS:
            self._aborted.popitem(last=False)
        self._matcher.drop_call(ctx, tag)
        for recv in self._matcher.take_call(ctx, tag):
            _fail(recv.future, error)

    def send_abort(self, ranks: Iterable[int], ctx: int, tag: int, error: BaseException) -> None:
        """Tell ``ranks`` that call (ctx, tag) failed here with ``error`` (best effort)."""
        frame = encode_header(abort_header(self.rank, ctx, tag, error))
        for rank in ranks:
            connection = self._connections.get(rank)
            if connection is not None:
                try:
                    connection.send_frame(frame, None)
                except PeerLostError:
                    pass

    def cancel_recv(self, recv: PostedRecv) -> bool:
        """Withdraw a receive that has not matched yet; True if it was withdrawn."""
        return self._matcher.unpost(recv)

    def take_stale(self, ctx: int, below_tag: int) -> Header | None:
        """Consume a message of ``ctx`` with a tag below ``below_tag`` that no
        receive matched; return its header (None if there is none)."""
        inbound = self._matcher.take_stale(ctx, below_tag)
        return inbound.header if inbound is not None else None

    def by_memory(self, rank: int, *, sending: bool) -> bool:
        """Whether payloads sent to (``sending``) or received from ``rank``
        can go by memory; False once the connection is gone."""
        connection = self._connections.get(rank)
        if connection is None:
            return False
        return connection.peer_reads_me if sending else connection.peer_memory is not None

    def peer_error(self, rank: int) -> PeerLostError | None:
        """The error that ended the stream to ``rank``, if it has ended."""
        return self._losses.error(rank)

    # -- incoming frames (called by the decoder through _PeerSink) -----------

    def _start_payload(self, sink: _PeerSink, header: Header) -> memoryview:
        return self._destination(sink, self._route(sink, header), header.nbytes)

    def _destination(self, sink: _PeerSink, target: PostedRecv | Inbound, nbytes: int) -> memoryview:
        """Where the payload routed to ``target`` is to be read."""
        sink.current = target
        if not isinstance(target, PostedRecv):
            return memoryview(target.data)
        if target.fold is None:
            return target.buf.view
        sink.staged = pool.take_bytes(nbytes)  # folded in when complete
        return memoryview(sink.staged)

    def _finish_frame(self, sink: _PeerSink, header: Header) -> None:
        if header.kind == Kind.PING:  # the heartbeat: receiving it was the point
            return
        if header.kind == Kind.BYE:
            error = PeerLostError(f"rank {sink.rank} closed its process group", sink.rank)
            self._peer_lost(sink.rank, error, orderly=True)
            return
        if header.kind == Kind.ABORT:
            self._call_aborted(header)
            return
        if header.kind == Kind.DONE:
            connection = self._connections.get(sink.rank)
            if connection is not None:  # else: it came after the peer's BYE, in the same read
                connection.remote_done()
            return
        if header.kind == Kind.REMOTE:  # copied out of the sender's memory into where it is routed
            self._read_remote(sink, header)
        target = sink.current if header.nbytes or header.kind == Kind.REMOTE else self._route(sink, header)
        sink.current = None
        if isinstance(target, PostedRecv):
            staged, sink.staged = sink.staged, None
            if staged is not None:
                if not target.future.done():  # a call that failed meanwhile leaves its buffer alone
                    target.fold(staged, 0)
                pool.give_back(staged)
            if not target.future.done():
                target.future.set_result(header)
            return
        target.complete = True
        if target.waiter is not None:
            self._deliver_unexpected(target, target.waiter)

    def _read_remote(self, sink: _PeerSink, header: Header) -> None:
        """Copy a REMOTE payload out of the sender's memory, or fold it in
        piece by piece, without staging it, for a folding receive."""
        connection = self._connections[sink.rank]
        target = self._route(sink, header)
        if isinstance(target, PostedRecv) and target.fold is not None:
            sink.current = target
            connection.fold_remote(target.fold, header.nbytes, header.addr)
        else:
            connection.take_remote(self._destination(sink, target, header.nbytes), header.addr)

    def _route(self, sink: _PeerSink, header: Header) -> PostedRecv | Inbound:
        if header.src != sink.rank:
            raise ProtocolError(f"rank {sink.rank} sent a frame claiming to come from rank {header.src}")
        if header.kind not in (Kind.DATA, Kind.REMOTE):
            raise ProtocolError(f"rank {sink.rank} sent a frame of kind {header.kind} with a payload")
        recv = self._matcher.take_posted(header)
        if recv is not None:
            error = misfit(header, recv, self.rank)
            if error is None:
                return recv
            recv.future.set_exception(error)  # the payload is read and dropped
            return Inbound(header, np.empty(header.nbytes, np.uint8))
        inbound = Inbound(header, pool.take_bytes(header.nbytes))
        if (header.ctx, header.tag) not in self._aborted:  # else: read and dropped
            self._matcher.add_unexpected(inbound)
        return inbound

    def _call_aborted(self, header: Header) -> None:
        self.fail_call(header.ctx, header.tag, error_from_abort(header))

    def _deliver_unexpected(self, inbound: Inbound, recv: PostedRecv) -> None:
        future = recv.future
        if future.done():
            return
        error = inbound.failure or misfit(inbound.header, recv, self.rank)
        if error is not None:
            future.set_exception(error)
        elif not inbound.complete:
            inbound.waiter = recv
        else:
            if recv.fold is not None:
                recv.fold(inbound.data, 0)
            else:
                recv.buf.view[:] = memoryview(inbound.data)
            pool.give_back(inbound.data)
            future.set_result(inbound.header)

    # -- failures --------------------------------------------------------------

    def _unreachable(self, rank: int) -> Exception:
        if self.closed:
            return ClosedError(f"rank {self.rank}: the process group is closed")
        return self._losses.error(rank) or PeerLostError(f"rank {self.rank} has no connection to rank {rank}", rank)

    def _peer_lost(self, rank: int, error: PeerLostError, orderly: bool = False) -> None:
        """Fail everything that depends on ``rank``; called once per peer.

        ``orderly``: the peer said goodbye (not worth a warning by itself).
        """
        if not self._losses.record(rank, error, orderly=orderly):
            return
        connection = self._connections.pop(rank, None)
        if connection is not None:
            connection.close(error)
        if not self.closed:
            log.log(logging.INFO if orderly else logging.WARNING, "rank %d lost rank %d: %s", self.rank, rank, error)
        sink = self._sinks.pop(rank, None)
        current = sink.current if sink is not None else None
        if isinstance(current, PostedRecv):
            _fail(current.future, error)
        elif isinstance(current, Inbound):
            current.failure = error
            if current.waiter is not None:
                _fail(current.waiter.future, error)
        fatal = self._losses.fatal_for
        for recv in self._matcher.take_dependents(rank, lambda recv: fatal(recv) is not None):
            _fail(recv.future, fatal(recv) or error)

    async def close(self) -> None:
        """Say goodbye to every peer, flush what was sent, close every socket.

        Receives still waiting fail with :class:`ClosedError`.
        """
        if self.closed:
            return
        self.closed = True
        await self._heartbeat.stop()
        bye = encode_header(Header(Kind.BYE, 0, self.rank, 0, 0, "uint8", (), 0))
        drains = []
        for connection in self._connections.values():
            try:
                connection.send_frame(bye, None)
            except PeerLostError:
                continue
            drains.append(connection.drain())
        if drains:
            try:
                await asyncio.wait_for(asyncio.gather(*drains, return_exceptions=True), _CLOSE_DRAIN_SECONDS)
            except asyncio.TimeoutError:
                log.warning("rank %d: peers did not take the last frames within %g s", self.rank, _CLOSE_DRAIN_SECONDS)
        closed = ClosedError(f"rank {self.rank}: the process group was destroyed")
        for rank in list(self._connections):
            self._peer_lost(rank, PeerLostError(f"rank {self.rank} closed its connection to rank {rank}", rank))
        for recv in self._matcher.take_all():
            _fail(recv.future, closed)
        await self._mesh.close()
        if self._all_connected is not None and not self._all_connected.done():
            self._all_connected.cancel()


def _fail(future: asyncio.Future, error: BaseException) -> None:
    """Fail a receive's future, unless it is done already.

    Marked as retrieved: whoever awaits it still gets the error, but the
    receives of a failed collective that nobody awaits any more (its later
    steps) must not be logged by asyncio as "never retrieved".
    """
    if not future.done():
        future.set_exception(error)
        future.exception()

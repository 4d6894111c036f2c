"""Where an arriving payload goes: a posted receive, folded into one, or held.

The :class:`Mailbox` of a rank keeps its posted receives and its unexpected
messages (the :class:`~asyncdist.engine.matching.Matcher`) and the calls that
failed, whose messages are dropped. A :class:`PeerInbox` per connection is
its frame decoder's sink: it routes each payload as its header arrives,

* into the buffer of the receive it matches, read there straight from the
  socket or copied once out of the sender's memory;
* for a *folding* receive (:attr:`PostedRecv.fold`), combined into that
  buffer: read 1 MiB at a time from the sender's memory, or into a scratch
  buffer from the socket and combined when complete;
* else into a buffer of its own, as an unexpected message, copied (or
  folded) once when its receive is posted.

Control frames (heartbeat, goodbye, abort, DONE, …) go to the engine,
decoded into their :mod:`~asyncdist.wire.control` values. Loop
thread only; nothing here touches sockets but through the connection.

A payload that needs a buffer of its own and that this process cannot hold
(more than the host's memory, or an allocation that fails) is refused with
:class:`~asyncdist.errors.FrameTooLargeError`, naming the sender: that
peer alone is dropped, with one line, instead of a ``MemoryError`` out of a
loop callback.
"""

from __future__ import annotations

import asyncio
import os
from collections import OrderedDict
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..errors import AsyncDistError, FrameTooLargeError, ProtocolError
from ..flight.counters import Counters
from .matching import Inbound, Matcher, PostedRecv, misfit
from ..buffers.scratch import pool
from ..wire.control import ControlFrame, decode_control
from ..wire.frames import Header, Kind

if TYPE_CHECKING:
    from ..transport.stream import Connection

__all__ = ["Mailbox", "PeerInbox", "fail_future"]

# Aborted calls remembered (so a receive posted after the ABORT fails too).
_MAX_ABORTED_CALLS = 4096
_PAYLOAD_KINDS = (Kind.DATA, Kind.REMOTE)


def _host_memory_bytes() -> int | None:
    """This host's physical memory (None where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


#: No buffer of a message's own may be larger (None: no bound but the allocator's).
HOST_MEMORY_BYTES = _host_memory_bytes()


def own_buffer(sender: int, nbytes: int) -> np.ndarray:
    """A buffer of its own for a payload of ``nbytes`` from rank ``sender``.

    Raises:
        FrameTooLargeError: this process cannot hold it.
    """
    if HOST_MEMORY_BYTES is not None and nbytes > HOST_MEMORY_BYTES:
        raise FrameTooLargeError(
            f"rank {sender} announced a payload of {nbytes} bytes, more than this host's memory "
            f"({HOST_MEMORY_BYTES} bytes)"
        )
    try:
        return pool.take_bytes(nbytes)
    except MemoryError:
        raise FrameTooLargeError(
            f"rank {sender} announced a payload of {nbytes} bytes, and this process cannot allocate it"
        ) from None


def fail_future(future: asyncio.Future, error: BaseException) -> None:
    """Fail a receive's future, unless it is done already.

    Marked as retrieved: whoever awaits it still gets the error, but the
    receives of a failed collective that nobody awaits any more (its later
    steps) must not be logged by asyncio as "never retrieved".
    """
    if not future.done():
        future.set_exception(error)
        future.exception()


class Mailbox:
    """The receives, unexpected messages and failed calls of one rank.

    Args:
        rank: this rank (for error messages).
    """

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._matcher = Matcher()
        #: The unexpected messages (the matcher's, by (ctx, src, tag)): empty in the
        #: common case, which the engine tests before asking for any of them.
        self.unexpected = self._matcher.unexpected
        #: The calls failed here, (ctx, tag) -> why (the latest ones), and the
        #: contexts revoked, ctx -> why every receive of it fails: read only.
        self.aborted: OrderedDict[tuple[int, int], AsyncDistError] = OrderedDict()
        self.revoked: dict[int, AsyncDistError] = {}
        self._screens: dict[int, Callable[[Header], bool]] = {}

    def screen(self, ctx: int, keep: Callable[[Header], bool]) -> None:
        """Ask ``keep(header)`` about every message of ``ctx`` that no receive
        takes, as its header arrives: True queues it as unexpected, False drops it.

        A group's root announcements (no receive is ever posted for them) and
        its collective calls' early or stale messages are checked on arrival
        this way. Messages of a call that failed here are dropped unasked.
        """
        self._screens[ctx] = keep

    def take_queued(self, ctx: int, tag: int) -> list[Header]:
        """Remove and return the headers of the unexpected messages of call (ctx, tag)."""
        return [inbound.header for inbound in self._matcher.take_call_messages(ctx, tag)]

    def post(self, recv: PostedRecv, lost: AsyncDistError | None) -> None:
        """Match ``recv`` with the earliest unexpected message that fits, or
        queue it; fail it instead if its call failed, its context was revoked,
        or ``lost`` says a peer it depends on is gone."""
        if self.revoked and recv.ctx in self.revoked:
            fail_future(recv.future, self.revoked[recv.ctx])
            return
        if self.unexpected:  # else nothing can match: the common case, without a call
            inbound = self._matcher.take_unexpected(recv.ctx, recv.src, recv.tag)
            if inbound is not None:
                self.deliver(inbound, recv)
                return
        failed = lost or self.aborted.get((recv.ctx, recv.tag))
        if failed is not None:
            fail_future(recv.future, failed)
            return
        self._matcher.post(recv)

    def cancel(self, recv: PostedRecv) -> bool:
        """Withdraw a receive that has not matched yet; True if it was withdrawn."""
        return self._matcher.unpost(recv)

    def call_error(self, ctx: int, tag: int) -> AsyncDistError | None:
        """The error call (ctx, tag) was marked failed with here (or its context
        revoked with), if it was (and is still remembered)."""
        if self.revoked and ctx in self.revoked:
            return self.revoked[ctx]
        return self.aborted.get((ctx, tag))

    def revoke(self, ctx: int, error: AsyncDistError) -> None:
        """Fail every receive of context ``ctx`` with ``error``, now and later,
        and drop its messages, queued or still to come."""
        if ctx in self.revoked:
            return
        self.revoked[ctx] = error
        for recv in self._matcher.take_context(ctx):
            fail_future(recv.future, error)

    def fail_call(self, ctx: int, tag: int, error: AsyncDistError) -> None:
        """Mark call (ctx, tag) failed: its receives fail with ``error``, now and
        later, and its messages, queued or still to come, are dropped."""
        if (ctx, tag) in self.aborted:
            return
        self.aborted[(ctx, tag)] = error
        if len(self.aborted) > _MAX_ABORTED_CALLS:
            self.aborted.popitem(last=False)
        self._matcher.drop_call(ctx, tag)
        for recv in self._matcher.take_call(ctx, tag):
            fail_future(recv.future, error)

    def take_stale(self, ctx: int, below_tag: int) -> Header | None:
        """Consume a message of ``ctx`` with a tag below ``below_tag`` that no
        receive matched; return its header (None if there is none)."""
        inbound = self._matcher.take_stale(ctx, below_tag)
        return inbound.header if inbound is not None else None

    def fail_dependents(
        self, rank: int, fatal: Callable[[PostedRecv], AsyncDistError | None], error: AsyncDistError
    ) -> None:
        """``rank`` is lost: fail the receives that name it with ``error``, and
        those that depend on it otherwise with what ``fatal`` says, if anything."""
        for recv in self._matcher.take_dependents(rank, lambda recv: fatal(recv) is not None):
            fail_future(recv.future, fatal(recv) or error)

    def fail_all(self, error: AsyncDistError) -> None:
        """Fail every receive still posted (the engine closes)."""
        for recv in self._matcher.take_all():
            fail_future(recv.future, error)

    def route(self, sender: int, header: Header) -> PostedRecv | Inbound:
        """Where the payload of ``header`` from rank ``sender`` goes: the
        receive it matches, or a new unexpected message.

        Raises:
            ProtocolError: the header claims another sender, or is not a payload's.
        """
        if header.src != sender:
            raise ProtocolError(f"rank {sender} sent a frame claiming to come from rank {header.src}")
        if header.kind not in _PAYLOAD_KINDS:
            raise ProtocolError(f"rank {sender} sent a frame of kind {header.kind} with a payload")
        recv = self._matcher.take_posted(header)
        if recv is not None:
            error = misfit(header, recv, self.rank)
            if error is None:
                return recv
            recv.future.set_exception(error)  # the payload is read and dropped
            return Inbound(header, own_buffer(sender, header.nbytes))
        inbound = Inbound(header, own_buffer(sender, header.nbytes))
        if (header.ctx, header.tag) in self.aborted or header.ctx in self.revoked:
            return inbound  # read and dropped: its call failed here
        screen = self._screens.get(header.ctx)
        if screen is None or screen(header):
            self._matcher.add_unexpected(inbound)
        return inbound  # else read and dropped

    def deliver(self, inbound: Inbound, recv: PostedRecv) -> None:
        """Hand an unexpected message to the receive that matched it (at once
        if its payload is complete, else when it is)."""
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


class PeerInbox:
    """One connection's arriving frames (its decoder's sink).

    Args:
        mailbox: the rank's mailbox, where payloads are routed.
        rank: the peer's rank.
        on_control: called with the peer's rank and each control frame
            (heartbeat, goodbye, abort, DONE, …), decoded.
        counters: where arriving messages are counted (None: not counted).

    Attributes:
        connection: the connection the frames come from (set once it exists).
        current: the receive, or unexpected message, whose payload is being read.
    """

    __slots__ = ("_mailbox", "rank", "_on_control", "connection", "current", "_staged", "_counters")

    def __init__(
        self, mailbox: Mailbox, rank: int, on_control: Callable[[int, ControlFrame], None], counters: Counters | None = None
    ) -> None:
        self._counters = counters  # received messages and bytes, per peer
        self._mailbox = mailbox
        self.rank = rank
        self._on_control = on_control
        self.connection: Connection | None = None
        self.current: PostedRecv | Inbound | None = None
        self._staged: np.ndarray | None = None  # where it is read, for a folding receive

    def payload_buffer(self, header: Header) -> memoryview:
        target = self._mailbox.route(self.rank, header)
        if type(target) is PostedRecv and target.fold is None:  # the common case, inline
            self.current = target
            return target.buf.view
        return self._destination(target, header.nbytes)

    def frame_received(self, header: Header, payload: memoryview) -> None:
        if header.kind not in _PAYLOAD_KINDS:
            self._on_control(self.rank, decode_control(header))
            return
        counters = self._counters
        if counters is not None:
            counters.received_bytes[self.rank] += header.nbytes
            counters.received_messages[self.rank] += 1
        if header.kind == Kind.REMOTE:  # copied out of the sender's memory into where it is routed
            self._read_remote(header)
        target = self.current if header.nbytes or header.kind == Kind.REMOTE else self._mailbox.route(self.rank, header)
        self.current = None
        if isinstance(target, PostedRecv):
            staged, self._staged = self._staged, None
            if staged is not None:
                assert target.fold is not None, "only a folding receive is staged"
                if not target.future.done():  # a call that failed meanwhile leaves its buffer alone
                    target.fold(staged, 0)
                pool.give_back(staged)
            if not target.future.done():
                target.future.set_result(header)
            return
        assert target is not None, "a payload is routed before it is read"
        target.complete = True
        if target.waiter is not None:
            self._mailbox.deliver(target, target.waiter)

    def lose(self, error: AsyncDistError) -> None:
        """The peer is lost: fail the receive whose payload was being read."""
        current = self.current
        if isinstance(current, PostedRecv):
            fail_future(current.future, error)
        elif isinstance(current, Inbound):
            current.failure = error
            if current.waiter is not None:
                fail_future(current.waiter.future, error)

    def _destination(self, target: PostedRecv | Inbound, nbytes: int) -> memoryview:
        """Where the payload routed to ``target`` is to be read."""
        self.current = target
        if not isinstance(target, PostedRecv):
            return memoryview(target.data)
        if target.fold is None:
            return target.buf.view
        self._staged = pool.take_bytes(nbytes)  # folded in when complete
        return self._staged.data

    def _read_remote(self, header: Header) -> None:
        """Copy a REMOTE payload out of the sender's memory, or fold it in
        piece by piece, without staging it, for a folding receive."""
        connection = self.connection
        assert connection is not None, "frames come from a connection"
        target = self._mailbox.route(self.rank, header)
        if isinstance(target, PostedRecv) and target.fold is not None:
            self.current = target
            connection.by_memory.fold(target.fold, header.nbytes, header.addr)
        else:
            connection.by_memory.take(self._destination(target, header.nbytes), header.addr)

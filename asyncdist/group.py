"""``ProcessGroup``: the await API of a set of ranks.

A group maps its own ranks (0..size-1) onto the engine's global ranks and
gives every operation a context, a tag, a timeout and an error message that
names it. Point-to-point messages use the group's p2p context with the
user's tag; each collective call takes the next sequence number of the
group and uses it as its tag in the group's collective context, so calls
never mix, even when several run at once on one loop.

Loop thread only: the ``i*`` methods start an operation and return a
:class:`~asyncdist.work.Work` at once; the ``async`` methods complete it.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Callable, Sequence

from .buffers import HostBuffer, as_host_buffer
from .collectives.barrier import dissemination_barrier
from .engine import Engine
from .errors import InvalidArgumentError, InvalidRankError, OperationTimeoutError
from .matching import PostedRecv
from .wire import Header, Kind
from .work import Work, completed_future

__all__ = ["ProcessGroup", "Channel"]

_INT64 = 1 << 63


class ProcessGroup:
    """A set of ranks that communicate; the world or a subgroup.

    Args:
        engine: this rank's engine.
        ranks: the global ranks of the members, in group-rank order.
        name: the group's name, for error messages.
        timeout: seconds every operation of this group may take.

    Attributes:
        rank: this process's rank in the group, -1 if it is not a member.
        size: the number of members.
        ranks: the members' global ranks.
    """

    def __init__(self, engine: Engine, ranks: Sequence[int], *, name: str, timeout: float) -> None:
        self._engine = engine
        self.ranks = tuple(ranks)
        self._group_rank_of = {g: i for i, g in enumerate(self.ranks)}
        if len(self._group_rank_of) != len(self.ranks):
            raise InvalidArgumentError(f"group {name!r}: ranks {list(ranks)} contain duplicates")
        self.rank = self._group_rank_of.get(engine.rank, -1)
        self.size = len(self.ranks)
        self.name = name
        self.timeout = timeout
        # Every rank creates groups in the same order (as torch requires), so
        # the contexts agree across ranks without any communication.
        self._p2p_ctx = engine.new_context()
        self._coll_ctx = engine.new_context()
        self._seq = 0
        self._others = frozenset(self.ranks) - {engine.rank}
        self._closers: list[Callable[[], Any]] = []

    def __repr__(self) -> str:
        return f"<ProcessGroup {self.name!r} rank {self.rank}/{self.size}>"

    # -- rank mapping --------------------------------------------------------

    def global_rank(self, group_rank: int) -> int:
        """The global rank of member ``group_rank``."""
        self._check_rank(group_rank, "group_rank")
        return self.ranks[group_rank]

    def group_rank(self, global_rank: int) -> int:
        """The group rank of global rank ``global_rank``.

        Raises:
            InvalidRankError: that rank is not a member.
        """
        try:
            return self._group_rank_of[global_rank]
        except KeyError:
            raise InvalidRankError(f"global rank {global_rank} is not in group {self.name!r} (ranks {list(self.ranks)})") from None

    def _check_rank(self, rank: object, what: str) -> int:
        if type(rank) is not int or not 0 <= rank < self.size:
            raise InvalidRankError(f"invalid {what} {rank!r} for group {self.name!r} of size {self.size}")
        return rank

    def _peer(self, rank: object, what: str) -> int:
        self._check_member()
        self._check_rank(rank, what)
        if rank == self.rank:
            kind = "destination" if what == "dst" else "source"
            raise InvalidRankError(
                f"Invalid {kind} rank: {kind} rank should not be the same as the rank of the current process "
                f"(rank {rank} in group {self.name!r})"
            )
        return self.ranks[rank]

    def _check_member(self) -> None:
        if self.rank < 0:
            raise InvalidRankError(f"rank {self._engine.rank} is not a member of group {self.name!r} (ranks {list(self.ranks)})")

    @staticmethod
    def _check_tag(tag: object) -> int:
        if type(tag) is not int or not -_INT64 <= tag < _INT64:
            raise InvalidArgumentError(f"tag must be an int64, got {tag!r}")
        return tag

    # -- point to point --------------------------------------------------------

    def isend(self, tensor: Any, dst: int, tag: int = 0) -> Work:
        """Start sending ``tensor`` to group rank ``dst``; the Work completes when
        the buffer may be reused."""
        future, what = self._start_send(tensor, dst, tag)
        loop = asyncio.get_running_loop()
        if future is None:
            future = completed_future(loop)
        else:
            self._arm_timeout(future, what)
        return Work(future, what, [tensor])

    async def send(self, tensor: Any, dst: int, tag: int = 0) -> None:
        """Send ``tensor`` to group rank ``dst``; returns when the buffer may be reused.

        Raises:
            InvalidRankError: ``dst`` is out of range or this rank.
            UnsupportedBufferError: ``tensor`` is not a contiguous CPU array.
            PeerLostError: ``dst`` is gone.
            OperationTimeoutError: not sent within the group's timeout.
        """
        future, what = self._start_send(tensor, dst, tag)
        if future is not None:
            await self._wait(future, self._deadline(), what)

    def _start_send(self, tensor: Any, dst: int, tag: int) -> tuple[asyncio.Future | None, str]:
        peer = self._peer(dst, "dst")
        self._check_tag(tag)
        buf = as_host_buffer(tensor)
        header = Header(Kind.DATA, self._p2p_ctx, self._engine.rank, tag, 0, buf.dtype, buf.shape, buf.nbytes)
        return self._engine.send(peer, header, buf.view), f"send to rank {dst} (tag {tag}, group {self.name!r})"

    def irecv(self, tensor: Any, src: int | None = None, tag: int = 0) -> Work:
        """Start receiving into ``tensor``; the Work's value is the sender's group rank."""
        recv, what = self._start_recv(tensor, src, tag)
        future = self._chain(recv.future, lambda header: self._group_rank_of[header.src])
        self._arm_timeout(future, what, lambda: self._engine.cancel_recv(recv))
        return Work(future, what, [tensor])

    async def recv(self, tensor: Any, src: int | None = None, tag: int = 0) -> int:
        """Receive into ``tensor`` from group rank ``src`` (any rank if None).

        Returns:
            the sender's group rank.

        Raises:
            BufferMismatchError: the message's dtype or element count differs
                from ``tensor``'s (the message is consumed).
            PeerLostError, OperationTimeoutError: as for :meth:`send`.
        """
        recv, what = self._start_recv(tensor, src, tag)
        header = await self._wait(recv.future, self._deadline(), what, lambda: self._engine.cancel_recv(recv))
        return self._group_rank_of[header.src]

    def _start_recv(self, tensor: Any, src: int | None, tag: int) -> tuple[PostedRecv, str]:
        peer = None if src is None else self._peer(src, "src")
        if src is None:
            self._check_member()
        self._check_tag(tag)
        buf = as_host_buffer(tensor, writable=True)
        recv = self._engine.post_recv(self._p2p_ctx, peer, tag, buf, self._others)
        who = "any rank" if src is None else f"rank {src}"
        return recv, f"recv from {who} (tag {tag}, group {self.name!r})"

    # -- collectives -------------------------------------------------------------

    def channel(self, op: str) -> Channel:
        """Open the channel of the next collective call (each member must call
        collectives in the same order); ``op`` describes the call."""
        self._check_member()
        self._seq += 1
        return Channel(self, self._seq, op, self._deadline())

    async def barrier(self) -> None:
        """Return once every member has entered the barrier."""
        await dissemination_barrier(self.channel("barrier"))

    # -- timeouts ------------------------------------------------------------------

    def _deadline(self) -> float:
        return asyncio.get_running_loop().time() + self.timeout

    async def _wait(
        self, future: asyncio.Future, deadline: float, what: str, withdraw: Callable[[], Any] | None = None
    ) -> Any:
        """Await ``future`` until ``deadline``; on expiry or cancellation withdraw the operation."""
        if future.done():
            return future.result()
        loop = asyncio.get_running_loop()
        handle = loop.call_at(deadline, self._expire, future, what, withdraw)
        try:
            return await future
        except asyncio.CancelledError:
            if withdraw is not None:
                withdraw()
            raise
        finally:
            handle.cancel()

    def _arm_timeout(self, future: asyncio.Future, what: str, withdraw: Callable[[], Any] | None = None) -> None:
        loop = asyncio.get_running_loop()
        handle = loop.call_later(self.timeout, self._expire, future, what, withdraw)
        future.add_done_callback(lambda _: handle.cancel())

    def _expire(self, future: asyncio.Future, what: str, withdraw: Callable[[], Any] | None) -> None:
        if future.done():
            return
        if withdraw is not None:
            withdraw()
        future.set_exception(
            OperationTimeoutError(f"rank {self._engine.rank}: {what} did not complete within {self.timeout:g} s")
        )

    @staticmethod
    def _chain(source: asyncio.Future, convert: Callable[[Any], Any]) -> asyncio.Future:
        """A future that completes with ``convert(source.result())`` or source's error."""
        target = source.get_loop().create_future()

        def transfer(done: asyncio.Future) -> None:
            if target.done():
                return
            error = done.exception()
            if error is not None:
                target.set_exception(error)
            else:
                target.set_result(convert(done.result()))

        source.add_done_callback(transfer)
        return target

    # -- lifetime --------------------------------------------------------------------

    def on_close(self, closer: Callable[[], Any]) -> None:
        """Run ``closer`` (a function or coroutine function) when the group closes."""
        self._closers.append(closer)

    async def close(self) -> None:
        """Release what this group owns (for the world group: the engine and store)."""
        closers, self._closers = self._closers, []
        for closer in reversed(closers):
            result = closer()
            if inspect.isawaitable(result):
                await result

    async def __aenter__(self) -> ProcessGroup:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class Channel:
    """The point-to-point view one collective call has of its group.

    Collective algorithms (``asyncdist.collectives``) are written against
    this: peers are group ranks, every message carries the call's sequence
    number as its tag and the call's description for mismatch checks, and
    every wait honours the call's deadline.
    """

    __slots__ = ("_group", "seq", "op", "deadline", "rank", "size")

    def __init__(self, group: ProcessGroup, seq: int, op: str, deadline: float) -> None:
        self._group = group
        self.seq = seq
        self.op = op
        self.deadline = deadline
        self.rank = group.rank
        self.size = group.size

    def _describe(self, verb: str, peer: int) -> str:
        return f"{self.op} (call #{self.seq} in group {self._group.name!r}) {verb} rank {peer}"

    def start_send(self, buf: HostBuffer, peer: int) -> asyncio.Future | None:
        """Start sending ``buf`` to group rank ``peer``; None if already sent."""
        group = self._group
        header = Header(
            Kind.DATA, group._coll_ctx, group._engine.rank, self.seq, self.seq, buf.dtype, buf.shape, buf.nbytes, self.op
        )
        return group._engine.send(group.ranks[peer], header, buf.view)

    def start_recv(self, buf: HostBuffer, peer: int) -> PostedRecv:
        """Post a receive into ``buf`` from group rank ``peer``."""
        group = self._group
        return group._engine.post_recv(group._coll_ctx, group.ranks[peer], self.seq, buf)

    async def wait_send(self, future: asyncio.Future | None, peer: int) -> None:
        """Wait for a send started with :meth:`start_send`."""
        if future is not None:
            await self._group._wait(future, self.deadline, self._describe("sending to", peer))

    async def wait_recv(self, recv: PostedRecv, peer: int) -> Header:
        """Wait for a receive started with :meth:`start_recv`."""
        engine = self._group._engine
        return await self._group._wait(
            recv.future, self.deadline, self._describe("waiting for", peer), lambda: engine.cancel_recv(recv)
        )

    async def send(self, buf: HostBuffer, peer: int) -> None:
        """Send ``buf`` to group rank ``peer``."""
        await self.wait_send(self.start_send(buf, peer), peer)

    async def recv(self, buf: HostBuffer, peer: int) -> Header:
        """Receive into ``buf`` from group rank ``peer``."""
        return await self.wait_recv(self.start_recv(buf, peer), peer)

    async def sendrecv(self, send_buf: HostBuffer, dst: int, recv_buf: HostBuffer, src: int) -> Header:
        """Send to ``dst`` and receive from ``src`` at once (no extra tasks)."""
        sending = self.start_send(send_buf, dst)
        receiving = self.start_recv(recv_buf, src)
        try:
            await self.wait_send(sending, dst)
        except BaseException:
            self._group._engine.cancel_recv(receiving)
            raise
        return await self.wait_recv(receiving, src)

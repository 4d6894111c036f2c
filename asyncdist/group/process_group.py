"""``ProcessGroup``: the await API of a set of ranks.

A group maps its own ranks (0..size-1) onto the engine's global ranks and
gives every operation a context, a tag, a timeout and an error message that
names it. Point-to-point messages use the group's p2p context with the
user's tag; each collective call takes the next sequence number of the
group and uses it as its tag in the group's collective context, so calls
never mix, even when several run at once on one loop.

Loop thread only: the ``i*`` methods start an operation and return a
:class:`~asyncdist.group.work.Work` at once; the ``async`` methods complete it.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Callable, Sequence

from ..buffers.host import as_host_buffer
from ..engine.channel import Channel, wait_until
from ..engine.engine import Engine
from ..gpu.device import any_device
from ..errors import CollectiveMismatchError, InvalidArgumentError, InvalidRankError, OperationTimeoutError
from .collectives import CollectiveMethods
from .devices import DeviceMethods
from .monitor import MonitorMethods
from .objects import ObjectMethods
from .subgroups import SubgroupMethods
from ..engine.matching import PostedRecv
from ..engine.progress import Message, Progress, timeout_message
from ..wire.frames import Header, Kind
from .work import Work, completed_future

__all__ = ["ProcessGroup"]

_INT64 = 1 << 63


class ProcessGroup(DeviceMethods, CollectiveMethods, ObjectMethods, MonitorMethods, SubgroupMethods):
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
        self._open_calls: set[int] = set()  # collective calls numbered and not yet finished here
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
        if any_device((tensor,)):
            return self._device_isend(tensor, dst, tag)
        future, what = self._start_send(tensor, dst, tag)
        if future is None:
            future = completed_future(asyncio.get_running_loop())
        message = self._message(what, future, (dst,), sending=True)
        self._arm_timeout(future, message)
        return self._work(future, message, [tensor])

    async def send(self, tensor: Any, dst: int, tag: int = 0) -> None:
        """Send ``tensor`` to group rank ``dst``; returns when the buffer may be reused.

        Raises:
            InvalidRankError: ``dst`` is out of range or this rank.
            UnsupportedBufferError: ``tensor`` is not a contiguous CPU array.
            PeerLostError: ``dst`` is gone.
            OperationTimeoutError: not sent within the group's timeout.
        """
        if any_device((tensor,)):
            return await self._device_isend(tensor, dst, tag)
        future, what = self._start_send(tensor, dst, tag)
        if future is not None:
            await self._wait(future, self._message(what, future, (dst,), sending=True))

    def _start_send(self, tensor: Any, dst: int, tag: int) -> tuple[asyncio.Future | None, str]:
        peer = self._peer(dst, "dst")
        self._check_tag(tag)
        buf = as_host_buffer(tensor)
        header = Header(Kind.DATA, self._p2p_ctx, self._engine.rank, tag, 0, buf.dtype, buf.shape, buf.nbytes)
        future = self._send_in_order(dst, lambda: self._engine.send(peer, header, buf.view))
        return future, f"send to rank {dst} (tag {tag}, group {self.name!r})"

    def irecv(self, tensor: Any, src: int | None = None, tag: int = 0) -> Work:
        """Start receiving into ``tensor``; the Work's value is the sender's group rank."""
        if any_device((tensor,)):
            return self._device_irecv(tensor, src, tag)
        recv, what = self._start_recv(tensor, src, tag)
        future = self._chain(recv.future, lambda header: self._group_rank_of[header.src])
        message = self._message(what, future, self._sources(src), sending=False)
        self._arm_timeout(future, message, lambda: self._engine.cancel_recv(recv))
        return self._work(future, message, [tensor])

    async def recv(self, tensor: Any, src: int | None = None, tag: int = 0) -> int:
        """Receive into ``tensor`` from group rank ``src`` (any rank if None).

        Returns:
            the sender's group rank.

        Raises:
            BufferMismatchError: the message's dtype or element count differs
                from ``tensor``'s (the message is consumed).
            PeerLostError, OperationTimeoutError: as for :meth:`send`.
        """
        if any_device((tensor,)):
            return await self._device_irecv(tensor, src, tag)
        recv, what = self._start_recv(tensor, src, tag)
        message = self._message(what, recv.future, self._sources(src), sending=False)
        header = await self._wait(recv.future, message, lambda: self._engine.cancel_recv(recv))
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

    def _sources(self, src: int | None) -> tuple[int, ...]:
        """The group ranks a receive from ``src`` waits on (every other member for any rank)."""
        return (src,) if src is not None else tuple(r for r in range(self.size) if r != self.rank)

    def _message(self, what: str, future: asyncio.Future, peers: Sequence[int], *, sending: bool) -> Message:
        return Message(what, future, peers, sending=sending, members=self.ranks)

    def _work(self, future: asyncio.Future, message: Message, outputs: list) -> Work:
        """A point-to-point Work, whose timed-out wait names its peer as a collective's does."""
        return Work(future, message.where, outputs, Progress(self._engine.rank, message.where, [message]))

    # -- collectives (the methods are in group_collectives) ------------------------

    def channel(self, op: str) -> Channel:
        """Open the channel of the next collective call; ``op`` describes the call.

        Every member must make its collective calls in the same order: the
        n-th call of each rank is matched with the n-th of the others.
        """
        self._check_member()
        # A message of a call that this rank has closed, and that no receive
        # took, means the ranks disagreed about that call. Calls still open
        # here (numbered, not finished) may legitimately have early messages.
        stale = self._engine.take_stale(self._coll_ctx, min(self._open_calls, default=self._seq + 1))
        seq = self._next_call()  # the next number, or one reserved for a staged device call
        channel = Channel(
            self._engine, self.ranks, self.rank, ctx=self._coll_ctx, seq=seq, op=op,
            timeout=self.timeout, group_name=self.name, on_close=self._open_calls.discard,
        )
        if stale is not None:
            error = CollectiveMismatchError(
                f"rank {self._engine.rank}: rank {stale.src} sent a message for {stale.op} (call #{stale.seq} in "
                f"group {self.name!r}) that no call of this rank expected; the ranks disagreed about that call"
            )
            channel.fail(error)  # the other members of this call learn of it now
            self._open_calls.discard(seq)
            raise error
        return channel

    # -- timeouts ------------------------------------------------------------------

    def _timeout_error(self, message: Message) -> Callable[[], Exception]:
        """The group's deadline passed for ``message``: name it and its peer(s)."""
        timeout = self.timeout  # as when the operation started

        def make() -> Exception:
            return OperationTimeoutError(timeout_message(self._engine.rank, message.where, timeout, message.awaited()))

        return make

    async def _wait(self, future: asyncio.Future, message: Message, withdraw: Callable[[], Any] | None = None) -> Any:
        deadline = asyncio.get_running_loop().time() + self.timeout
        return await wait_until(future, deadline, self._timeout_error(message), withdraw)

    def _arm_timeout(self, future: asyncio.Future, message: Message, withdraw: Callable[[], Any] | None = None) -> None:
        """Fail ``future`` (a Work's) if it is not done within the group's timeout."""
        if future.done():
            return
        make_error = self._timeout_error(message)

        def expire() -> None:
            if not future.done():
                error = make_error()  # before withdrawing: it reports what was pending
                if withdraw is not None:
                    withdraw()
                future.set_exception(error)

        def settle(done: asyncio.Future) -> None:
            handle.cancel()
            if done.cancelled() and withdraw is not None:  # a cancelled irecv must not take a later message
                withdraw()

        handle = asyncio.get_running_loop().call_later(self.timeout, expire)
        future.add_done_callback(settle)

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

"""``Channel``: the point-to-point view one collective call has of its group.

Collective algorithms (``asyncdist.collectives``) are written against a
Channel only: peers are group ranks, buffers are host buffers. A channel is
the call's :class:`~asyncdist.engine.operation.Operation` (its record, its
deadline and hang warning, what it waits on) with what every message of the
call needs: the group's collective context, the call's sequence number as
the tag (so calls never mix), the call's description in every header (so
ranks in different calls are detected, not corrupted), and the call's
deadline on every wait.

A channel keeps the receives and sends of its call that are still pending,
so that it can say at any moment which peers the call waits on. That one
answer words both the call's own timeout and the timeout of a
``Work.wait`` on the operation that made the call (a channel registers with
the Work's :class:`~asyncdist.engine.progress.Progress` when it opens).
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any, Awaitable, Callable, Mapping, Protocol, TypeVar

from .abort import is_relayed
from ..buffers.host import HostBuffer
from ..errors import AsyncDistError, OperationCancelledError, RankExcludedError
from ..flight.descriptions import Description
from .matching import Fold, PostedRecv
from .operation import Operation, OperationHost
from .progress import CURRENT
from ..wire.frames import Header, Kind, new_header

__all__ = ["Channel", "ChannelHost"]

T = TypeVar("T")


class ChannelHost(OperationHost, Protocol):
    """What a Channel needs of its engine (:class:`~asyncdist.engine.engine.Engine`)."""

    def post_recv(self, ctx: int, src: int | None, tag: int, buf: HostBuffer, sources: frozenset[int] = ...,
                  op: str | None = None, fold: Fold | None = None) -> PostedRecv: ...  # fmt: skip

    def cancel_recv(self, recv: PostedRecv) -> bool: ...

    def by_memory(self, rank: int, *, sending: bool) -> bool: ...

    @property
    def failed_calls(self) -> Mapping[tuple[int, int], AsyncDistError]: ...

    @property
    def revoked_contexts(self) -> Mapping[int, AsyncDistError]: ...

    def call_error(self, ctx: int, tag: int) -> AsyncDistError | None: ...

    def fail_call(self, ctx: int, tag: int, error: AsyncDistError) -> None: ...

    def send_abort(self, ranks: Any, ctx: int, tag: int, error: BaseException) -> None: ...


class Channel(Operation):
    """Send and receive by group rank within one collective call (an Operation).

    Args:
        engine: this rank's engine.
        ranks: the global rank of each group rank.
        rank: this process's group rank.
        ctx, seq, description, timeout, group_name: as for :class:`Operation`.
        on_close: told the call number once :meth:`run` has finished.
        record: whether the flight recorder records the call (the group
            layer records each call it numbers; a channel made only to fail
            a call is not).

    Attributes:
        rank, size: this process's group rank and the group size.
        op: the call's description as its messages carry it ("all_reduce(sum, float32[1024])").
    """

    __slots__ = ("_host", "_on_close", "_others", "rank", "size", "op")

    def __init__(
        self,
        engine: ChannelHost,
        ranks: tuple[int, ...],
        rank: int,
        *,
        ctx: int,
        seq: int,
        description: Description,
        timeout: float,
        group_name: str,
        on_close: Callable[[int], None] | None = None,
        record: bool = False,
    ) -> None:
        super().__init__(engine, "collective", ctx, seq, description, group_name, ranks, timeout, ranks, record=record)
        self._host = engine
        self._on_close = on_close
        # Every member this call depends on: losing any of them fails its receives.
        self._others = frozenset(ranks) - {engine.rank}
        self.rank = rank
        self.size = len(ranks)
        self.op = description.text
        progress = CURRENT.get()  # the Work this call runs for, if any
        if progress is not None:
            progress.add(self)

    def by_memory(self, peer: int, *, sending: bool) -> bool:
        """Whether large payloads sent to (``sending``) or received from group
        rank ``peer`` go by memory (:mod:`asyncdist.transport.cma`). Both ends of
        a link learn the same answer in their handshake, so an algorithm may
        choose its message sizes by it."""
        return self._host.by_memory(self.members[peer], sending=sending)

    # The methods below are the hot path of every collective: they write to the
    # Operation's slots themselves rather than call its methods (each Python
    # call costs ~0.1 us; asyncdist-bench --count-calls counts them).

    def start_send(self, buf: HostBuffer, peer: int) -> asyncio.Future | None:
        """Start sending ``buf`` to group rank ``peer``; None if already sent."""
        host, seq = self._host, self.seq
        fields = (Kind.DATA, self.ctx, host.rank, seq, seq, buf.dtype, buf.shape, buf.nbytes, self.op, 0)
        future = host.send(self.members[peer], new_header(Header, fields), buf.view)
        if future is not None:
            self._sending[future] = (peer,)
        return future

    def start_recv(self, buf: HostBuffer, peer: int, fold: Fold | None = None) -> PostedRecv:
        """Post a receive into ``buf`` from group rank ``peer``; with ``fold``,
        one that combines the message into ``buf`` (:func:`asyncdist.reduce.kernels.folder`)."""
        recv = self._host.post_recv(self.ctx, self.members[peer], self.seq, buf, self._others, op=self.op, fold=fold)
        self._receiving[recv.future] = (peer,)
        return recv

    def wait_send(self, future: asyncio.Future | None, peer: int) -> Awaitable[None]:
        """Await what this returns to wait for a send started with :meth:`start_send`
        (to group rank ``peer``; the channel noted the peer when the send
        started, for timeout messages)."""
        if future is None:
            future = asyncio.Future(loop=asyncio.get_running_loop())
            future.set_result(None)
        self._awaiting, self._withdraw = future, None  # what the deadline fails (see Operation.awaiting)
        return future

    def wait_recv(self, recv: PostedRecv, peer: int) -> Awaitable[Header]:
        """Await what this returns to wait for a receive started with
        :meth:`start_recv` (from group rank ``peer``; noted when it was posted).
        On the call's deadline it fails with an OperationTimeoutError naming
        every peer the call still waits on."""
        self._awaiting, self._withdraw = recv.future, partial(self._host.cancel_recv, recv)
        return recv.future

    async def run(self, algorithm: Awaitable[T], *, relay: bool = True) -> T:
        """Run the call's algorithm; if it fails or is cancelled here, fail the
        call (see :meth:`fail`; ``relay=False`` for an algorithm that tells the
        other members itself). Either way the call is closed: its group no
        longer waits for it.

        Raises:
            asyncio.CancelledError: the call was cancelled here (the other
                members get :class:`~asyncdist.errors.OperationCancelledError`).
            AsyncDistError: the algorithm's error.
        """
        handle = self._handle
        if handle is not None:  # started: its messages flow
            self._ring.start(handle)
        try:
            result = await algorithm
        except AsyncDistError as error:
            self.fail(error, relay=relay)
            raise
        except asyncio.CancelledError:
            me = self._host.rank
            self.fail(OperationCancelledError(f"rank {me}: {self.where} was cancelled on rank {me}"), relay=relay)
            raise
        finally:
            self.closed = True
            self._deadlines.open.pop(self, None)
            if self._on_close is not None:
                self._on_close(self.seq)
        # A part that only sends can finish after its call failed here (an
        # ABORT, a disagreement detected on arrival): it failed all the same.
        host = self._host
        if host.failed_calls or host.revoked_contexts:  # else none did: the common case, without a call
            failed = host.call_error(self.ctx, self.seq)
            if failed is not None:
                self.close(failed)
                raise failed
        if handle is not None:  # completed
            self._ring.end(handle)
        return result

    def fail(self, error: AsyncDistError, *, relay: bool = True) -> None:
        """Mark the call failed on this rank: its receives fail, its late
        messages are dropped (not taken for a later call's), and unless the
        error came from another rank, the other members get an ABORT so they
        fail at once instead of waiting for their timeout. A rank the others
        excluded tells them nothing: they have dropped it, and its ABORT could
        fail a call of theirs that has this one's number."""
        host = self._host
        self.close(error)
        host.fail_call(self.ctx, self.seq, error)
        if relay and not is_relayed(error) and not isinstance(error, RankExcludedError):
            host.send_abort([r for r in self.members if r != host.rank], self.ctx, self.seq, error)

    def withdraw(self, recv: PostedRecv) -> None:
        """Take back a receive that will not be waited for (the call failed)."""
        self._host.cancel_recv(recv)
        self.settled(recv.future)

    def send(self, buf: HostBuffer, peer: int) -> Awaitable[None]:
        """Send ``buf`` to group rank ``peer``: await what this returns."""
        return self.wait_send(self.start_send(buf, peer), peer)

    def recv(self, buf: HostBuffer, peer: int) -> Awaitable[Header]:
        """Receive into ``buf`` from group rank ``peer``: await what this returns."""
        return self.wait_recv(self.start_recv(buf, peer), peer)

"""``Channel``: the point-to-point view one collective call has of its group.

Collective algorithms (``asyncdist.collectives``) are written against a
Channel only: peers are group ranks, buffers are host buffers. The channel
adds what every message of the call needs: the group's collective context,
the call's sequence number as the tag (so calls never mix), the call's
description in every header (so ranks in different calls are detected,
not corrupted), and the call's deadline on every wait.

A channel also keeps the receives and sends of its call that are still
pending, so that it can say at any moment which peers the call waits on
(:meth:`Channel.awaited`). That one answer words both the call's own
timeout and the timeout of a ``Work.wait`` on the operation that made the
call (a channel is a :class:`~asyncdist.engine.progress.Step`, registered with the
Work's :class:`~asyncdist.engine.progress.Progress` when it opens).

Also here: :func:`wait_until`, the one way an operation waits for a future
with a deadline and withdraws what it posted when it gives up.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, TypeVar

from .abort import is_relayed
from ..buffers.host import HostBuffer
from .engine import Engine
from ..errors import (
    AsyncDistError, CollectiveMismatchError, OperationCancelledError, OperationTimeoutError, PeerLostError,
    RankExcludedError,
)
from .matching import Fold, PostedRecv
from .progress import Awaited, register, timeout_message
from ..wire.frames import Header, Kind

__all__ = ["Channel", "arm_deadline", "wait_until"]

T = TypeVar("T")

# The failures that dump the flight recorder (ASYNCDIST_TRACE_DIR), and how the dump's reason names them.
_DUMPED: dict[type, str] = {
    CollectiveMismatchError: "collective mismatch", PeerLostError: "lost peer", OperationTimeoutError: "operation timeout",
}


def arm_deadline(
    future: asyncio.Future,
    deadline: float,
    timeout_error: Callable[[], Exception],
    withdraw: Callable[[], Any] | None = None,
    warn: tuple[float, Callable[[], Any]] | None = None,
) -> Callable[[], None]:
    """Fail ``future`` with ``timeout_error()`` at ``deadline`` (loop time) if it
    is not done; return what disarms it.

    The error is made before ``withdraw`` (e.g. un-posting a receive) runs, so
    that it can report what was still pending. ``warn``: (loop time, callback)
    called if the future is still pending then, before the deadline (the hang
    warning); it shares the deadline's one timer, so it costs nothing more.
    """
    loop = asyncio.get_running_loop()
    handle: asyncio.TimerHandle

    def expire() -> None:
        if not future.done():
            error = timeout_error()
            if withdraw is not None:
                withdraw()
            future.set_exception(error)

    def early() -> None:
        nonlocal handle
        handle = loop.call_at(deadline, expire)
        assert warn is not None
        warn[1]()

    if warn is not None and warn[0] < deadline:
        handle = loop.call_at(warn[0], early)
    else:
        handle = loop.call_at(deadline, expire)
    return lambda: handle.cancel()


async def wait_until(
    future: asyncio.Future,
    deadline: float,
    timeout_error: Callable[[], Exception],
    withdraw: Callable[[], Any] | None = None,
    warn: tuple[float, Callable[[], Any]] | None = None,
) -> Any:
    """Await ``future`` until ``deadline`` (loop time), as :func:`arm_deadline`
    arms it; on cancellation too, ``withdraw`` runs."""
    if future.done():
        return future.result()
    disarm = arm_deadline(future, deadline, timeout_error, withdraw, warn)
    try:
        return await future
    except asyncio.CancelledError:
        if withdraw is not None:
            withdraw()
        raise
    finally:
        disarm()


class Channel:
    """Send and receive by group rank within one collective call.

    Attributes:
        rank, size: this process's group rank and the group size.
        seq: the call's sequence number in its group.
        op: the call's description ("all_reduce(sum, float32[1024])").
        closed: True once :meth:`run` has returned or raised.
    """

    __slots__ = (
        "_engine", "_ranks", "_members", "_ctx", "_timeout", "_group_name", "_on_close", "_receiving", "_sending",
        "seq", "op", "deadline", "rank", "size", "closed", "_ring", "_entry", "_warn_at",
    )

    def __init__(
        self,
        engine: Engine,
        ranks: tuple[int, ...],
        rank: int,
        *,
        ctx: int,
        seq: int,
        op: str,
        timeout: float,
        group_name: str,
        on_close: Callable[[int], None] | None = None,
        record: bool = False,
    ) -> None:
        self._engine = engine
        self._on_close = on_close
        # Every member this call depends on: losing any of them fails its receives.
        self._members = frozenset(ranks) - {engine.rank}
        self._ranks = ranks
        self._ctx = ctx
        self._timeout = timeout
        self._group_name = group_name
        self.seq = seq
        self.op = op
        posted = asyncio.get_running_loop().time()
        self.deadline = posted + timeout
        self.rank = rank
        self.size = len(ranks)
        self.closed = False
        # What the call still waits on: a receive until its wait returns or it
        # is withdrawn, a send until its last byte is in the kernel (by group rank).
        self._receiving: dict[PostedRecv, int] = {}
        self._sending: dict[asyncio.Future, int] = {}
        flight = engine.flight
        # Its flight record's handle: the group layer records each call it numbers
        # (a channel made only to fail a call is not); None when the recorder is off.
        self._ring = ring = flight.recorder.ring
        self._entry = ring.open("collective", ctx, group_name, seq, op, ranks, self, posted) if record else None
        # When a wait of this call warns that it hangs (None: never, or done).
        hang_warn = flight.hang_warn
        self._warn_at = posted + hang_warn if hang_warn else None
        register(self)  # with the Work this call runs for, if any

    @property
    def where(self) -> str:
        """The call as messages name it: "all_reduce(sum, float32[4]) (call #7 in group 'world')"."""
        return f"{self.op} (call #{self.seq} in group {self._group_name!r})"

    def is_open(self) -> bool:
        """False once :meth:`run` has finished (a :class:`~asyncdist.engine.progress.Step`)."""
        return not self.closed

    def awaited(self) -> Awaited:
        """The group ranks whose data this call still waits for, and those it
        is still sending to (any thread: a snapshot, see :mod:`asyncdist.engine.progress`)."""
        receiving = {peer for recv, peer in list(self._receiving.items()) if not recv.future.done()}
        sending = {peer for future, peer in list(self._sending.items()) if not future.done()}
        return Awaited(tuple(sorted(receiving)), tuple(sorted(sending)), self._ranks)

    def _timeout_error(self) -> Exception:
        """The call's deadline passed: name it and every peer it still waits on."""
        self._engine.flight.dumps.on_failure(f"operation timeout in {self.where}")
        return OperationTimeoutError(timeout_message(self._engine.rank, self.where, self._timeout, self.awaited()))

    def _warning(self) -> tuple[float, Callable[[], Any]] | None:
        """The hang warning a wait of this call arms, if any (see :func:`wait_until`)."""
        return None if self._warn_at is None else (self._warn_at, self._hang)

    def _hang(self) -> None:
        """The call has waited ``ASYNCDIST_HANG_WARN`` s: ask the peers it waits on where they are."""
        if self._warn_at is None or self.closed:
            return
        self._warn_at = None  # once per call
        engine = self._engine
        awaited = self.awaited()
        peers = [self._ranks[p] for p in awaited.receiving or awaited.sending]
        members = [rank for rank in self._ranks if rank != engine.rank]
        engine.flight.whereabouts.warn(self._ctx, self.seq, self.op, self._group_name, members, peers,
                                self.deadline - self._timeout)  # fmt: skip

    def by_memory(self, peer: int, *, sending: bool) -> bool:
        """Whether large payloads sent to (``sending``) or received from group
        rank ``peer`` go by memory (:mod:`asyncdist.transport.cma`). Both ends of
        a link learn the same answer in their handshake, so an algorithm may
        choose its message sizes by it."""
        return self._engine.by_memory(self._ranks[peer], sending=sending)

    def start_send(self, buf: HostBuffer, peer: int) -> asyncio.Future | None:
        """Start sending ``buf`` to group rank ``peer``; None if already sent."""
        engine = self._engine
        header = Header(Kind.DATA, self._ctx, engine.rank, self.seq, self.seq, buf.dtype, buf.shape, buf.nbytes, self.op)
        future = engine.send(self._ranks[peer], header, buf.view)
        if future is not None:
            self._sending[future] = peer
        return future

    def start_recv(self, buf: HostBuffer, peer: int, fold: Fold | None = None) -> PostedRecv:
        """Post a receive into ``buf`` from group rank ``peer``; with ``fold``,
        one that combines the message into ``buf`` (:func:`asyncdist.reduce.kernels.folder`)."""
        recv = self._engine.post_recv(self._ctx, self._ranks[peer], self.seq, buf, self._members, op=self.op, fold=fold)
        self._receiving[recv] = peer
        return recv

    async def wait_send(self, future: asyncio.Future | None, peer: int) -> None:
        """Wait for a send started with :meth:`start_send` (to group rank ``peer``;
        the channel noted the peer when the send started, for timeout messages)."""
        if future is not None:
            try:
                await wait_until(future, self.deadline, self._timeout_error, warn=self._warning())
            finally:
                self._sending.pop(future, None)

    async def wait_recv(self, recv: PostedRecv, peer: int) -> Header:
        """Wait for a receive started with :meth:`start_recv` (from group rank
        ``peer``; noted when it was posted). On the call's deadline it fails with
        an OperationTimeoutError naming every peer the call still waits on."""
        engine = self._engine
        try:
            return await wait_until(
                recv.future, self.deadline, self._timeout_error, lambda: engine.cancel_recv(recv), self._warning()
            )
        finally:
            self._receiving.pop(recv, None)

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
        entry = self._entry
        if entry is not None:  # started: its messages flow
            self._ring.start(entry)
        try:
            result = await algorithm
        except AsyncDistError as error:
            self.fail(error, relay=relay)
            raise
        except asyncio.CancelledError:
            me = self._engine.rank
            self.fail(OperationCancelledError(f"rank {me}: {self.where} was cancelled on rank {me}"), relay=relay)
            raise
        finally:
            self.closed = True
            if self._on_close is not None:
                self._on_close(self.seq)
        # A part that only sends can finish after its call failed here (an
        # ABORT, a disagreement detected on arrival): it failed all the same.
        failed = self._engine.call_error(self._ctx, self.seq)
        if failed is not None:
            self._close_record(failed)
            raise failed
        if entry is not None:  # completed
            self._ring.end(entry)
        return result

    def _close_record(self, error: AsyncDistError | None) -> None:
        """End the call's flight record (completed, or failed with ``error``)."""
        recorder = self._engine.flight.recorder
        if self._entry is None or not recorder.close(self._entry, error) or error is None:
            return
        why = next((why for kind, why in _DUMPED.items() if isinstance(error, kind)), None)
        if why is not None:  # also when another rank found it and told this one (an ABORT)
            if isinstance(error, PeerLostError):
                recorder.lost.setdefault(error.rank, str(error))
            self._engine.flight.dumps.on_failure(f"{why} in {self.where}")

    def fail(self, error: AsyncDistError, *, relay: bool = True) -> None:
        """Mark the call failed on this rank: its receives fail, its late
        messages are dropped (not taken for a later call's), and unless the
        error came from another rank, the other members get an ABORT so they
        fail at once instead of waiting for their timeout. A rank the others
        excluded tells them nothing: they have dropped it, and its ABORT could
        fail a call of theirs that has this one's number."""
        engine = self._engine
        self._close_record(error)
        engine.fail_call(self._ctx, self.seq, error)
        if relay and not is_relayed(error) and not isinstance(error, RankExcludedError):
            engine.send_abort([r for r in self._ranks if r != engine.rank], self._ctx, self.seq, error)

    def withdraw(self, recv: PostedRecv) -> None:
        """Take back a receive that will not be waited for (the call failed)."""
        self._engine.cancel_recv(recv)
        self._receiving.pop(recv, None)

    async def send(self, buf: HostBuffer, peer: int) -> None:
        """Send ``buf`` to group rank ``peer``."""
        await self.wait_send(self.start_send(buf, peer), peer)

    async def recv(self, buf: HostBuffer, peer: int) -> Header:
        """Receive into ``buf`` from group rank ``peer``."""
        return await self.wait_recv(self.start_recv(buf, peer), peer)

"""``Channel``: the point-to-point view one collective call has of its group.

Collective algorithms (``asyncdist.collectives``) are written against a
Channel only: peers are group ranks, buffers are host buffers. The channel
adds what every message of the call needs: the group's collective context,
the call's sequence number as the tag (so calls never mix), the call's
description in every header (so ranks in different calls are detected,
not corrupted), and the call's deadline on every wait.

Also here: :func:`wait_until`, the one way an operation waits for a future
with a deadline and withdraws what it posted when it gives up.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, TypeVar

from .abort import is_relayed
from .buffers import HostBuffer
from .engine import Engine
from .errors import AsyncDistError, OperationTimeoutError
from .matching import PostedRecv
from .wire import Header, Kind

__all__ = ["Channel", "wait_until"]

T = TypeVar("T")


async def wait_until(
    future: asyncio.Future,
    deadline: float,
    timeout_error: Callable[[], Exception],
    withdraw: Callable[[], Any] | None = None,
) -> Any:
    """Await ``future`` until ``deadline`` (loop time).

    On expiry the future fails with ``timeout_error()``; on expiry or
    cancellation ``withdraw`` (e.g. un-posting a receive) runs first.
    """
    if future.done():
        return future.result()
    loop = asyncio.get_running_loop()

    def expire() -> None:
        if not future.done():
            if withdraw is not None:
                withdraw()
            future.set_exception(timeout_error())

    handle = loop.call_at(deadline, expire)
    try:
        return await future
    except asyncio.CancelledError:
        if withdraw is not None:
            withdraw()
        raise
    finally:
        handle.cancel()


class Channel:
    """Send and receive by group rank within one collective call.

    Attributes:
        rank, size: this process's group rank and the group size.
        seq: the call's sequence number in its group.
        op: the call's description ("all_reduce(sum, float32[1024])").
    """

    __slots__ = (
        "_engine", "_ranks", "_members", "_ctx", "_timeout", "_group_name", "_on_close", "seq", "op", "deadline", "rank", "size",
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
        self.deadline = asyncio.get_running_loop().time() + timeout
        self.rank = rank
        self.size = len(ranks)

    def _timeout_error(self, verb: str, peer: int) -> Callable[[], Exception]:
        def make() -> Exception:
            return OperationTimeoutError(
                f"rank {self._engine.rank}: {self.op} (call #{self.seq} in group {self._group_name!r}) "
                f"did not complete within {self._timeout:g} s; still {verb} rank {peer}"
            )

        return make

    def start_send(self, buf: HostBuffer, peer: int) -> asyncio.Future | None:
        """Start sending ``buf`` to group rank ``peer``; None if already sent."""
        engine = self._engine
        header = Header(Kind.DATA, self._ctx, engine.rank, self.seq, self.seq, buf.dtype, buf.shape, buf.nbytes, self.op)
        return engine.send(self._ranks[peer], header, buf.view)

    def start_recv(self, buf: HostBuffer, peer: int) -> PostedRecv:
        """Post a receive into ``buf`` from group rank ``peer``."""
        return self._engine.post_recv(self._ctx, self._ranks[peer], self.seq, buf, self._members, op=self.op)

    async def wait_send(self, future: asyncio.Future | None, peer: int) -> None:
        """Wait for a send started with :meth:`start_send`."""
        if future is not None:
            await wait_until(future, self.deadline, self._timeout_error("sending to", peer))

    async def wait_recv(self, recv: PostedRecv, peer: int) -> Header:
        """Wait for a receive started with :meth:`start_recv`."""
        engine = self._engine
        return await wait_until(
            recv.future, self.deadline, self._timeout_error("waiting for", peer), lambda: engine.cancel_recv(recv)
        )

    async def run(self, algorithm: Awaitable[T], *, relay: bool = True) -> T:
        """Run the call's algorithm; if it fails or is cancelled here, fail the
        call (see :meth:`fail`; ``relay=False`` for an algorithm that tells the
        other members itself). Either way the call is closed: its group no
        longer waits for it."""
        try:
            return await algorithm
        except AsyncDistError as error:
            self.fail(error, relay=relay)
            raise
        except asyncio.CancelledError:
            me = self._engine.rank
            where = f"{self.op} (call #{self.seq} in group {self._group_name!r})"
            self.fail(OperationTimeoutError(f"rank {me}: {where} was cancelled on rank {me}"), relay=relay)
            raise
        finally:
            if self._on_close is not None:
                self._on_close(self.seq)

    def fail(self, error: AsyncDistError, *, relay: bool = True) -> None:
        """Mark the call failed on this rank: its receives fail, its late
        messages are dropped (not taken for a later call's), and unless the
        error came from another rank, the other members get an ABORT so they
        fail at once instead of waiting for their timeout."""
        engine = self._engine
        engine.fail_call(self._ctx, self.seq, error)
        if relay and not is_relayed(error):
            engine.send_abort([r for r in self._ranks if r != engine.rank], self._ctx, self.seq, error)

    def withdraw(self, recv: PostedRecv) -> None:
        """Take back a receive that will not be waited for (the call failed)."""
        self._engine.cancel_recv(recv)

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
            self.withdraw(receiving)
            raise
        return await self.wait_recv(receiving, src)

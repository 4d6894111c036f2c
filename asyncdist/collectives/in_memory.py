"""In-memory channels: n ranks as coroutines of one event loop, for testing algorithms.

An :class:`InMemoryNetwork` of ``size`` ranks hands messages over between
:class:`InMemoryChannel` s, one per rank and call, each satisfying
:class:`~asyncdist.collectives.channel.Channel`; :func:`run_ranks` runs an
algorithm on every rank at once and returns what each returned. Hundreds of
property-test examples run in the time one world of real ranks takes to
start.

It owns the semantics an algorithm may rely on (see
:mod:`asyncdist.collectives.channel`), kept as strictly as the engine keeps
them, and must not know engines, frames or sockets:

* **Matching.** A message matches on (receiver, sender, call tag): the
  earliest posted receive takes the earliest unmatched message, so messages
  from one peer never overtake each other.
* **Fit.** A message whose dtype or element count differs from the receive
  buffer fails that receive with :class:`~asyncdist.errors.BufferMismatchError`
  (the sender is done with it), as the engine's :func:`check_fits` does.
* **Folds.** A folding receive combines the message into its buffer, in
  pieces of ``fold_piece_bytes`` (whole elements) at their byte offsets, as
  the engine folds what it reads out of a peer's memory.
* **Links.** ``by_memory(src, dst)`` says which links carry payloads by
  memory. There the receiver copies out of the sender's buffer when the
  message matches, and the send is done only then (so an algorithm that
  changes a buffer before waiting for its send gets caught); over the other
  links a send copies its payload when it starts and is done at once.

Nothing here is thread-safe: one loop, the loop's thread only.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from ..buffers.host import ITEMSIZES, HostBuffer, check_fits
from ..errors import (
    BufferMismatchError,
    CollectiveMismatchError,
    InvalidRankError,
    OperationTimeoutError,
)
from .channel import Fold

__all__ = ["Envelope", "InMemoryChannel", "InMemoryNetwork", "PostedReceive", "run_ranks"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Envelope:
    """What a completed receive says about its message."""

    src: int
    dst: int
    tag: int
    dtype: str
    shape: tuple[int, ...]


@dataclass(slots=True, eq=False)
class PostedReceive:
    """A receive waiting for its message (an :class:`InMemoryChannel`'s receive handle)."""

    dst: int
    src: int
    tag: int
    buf: HostBuffer
    fold: Fold | None
    future: asyncio.Future[Envelope]


@dataclass(slots=True, eq=False)
class _Message:
    """A message started and not yet matched. ``payload`` is the sender's own
    memory on a by-memory link (``done`` pending), else a copy (``done`` None)."""

    envelope: Envelope
    payload: memoryview
    done: asyncio.Future[None] | None


class InMemoryNetwork:
    """The ranks of one in-memory group and the messages between them.

    Args:
        size: the number of ranks (>= 1).
        by_memory: ``by_memory(src, dst)``: whether the link from group rank
            ``src`` to ``dst`` carries payloads by memory. Default: no link.
        fold_piece_bytes: the most bytes a fold is handed at once (rounded
            down to whole elements, at least one); None: the whole message.

    Raises:
        InvalidArgumentError (InvalidRankError): ``size`` is below 1.
    """

    def __init__(
        self,
        size: int,
        *,
        by_memory: Callable[[int, int], bool] | None = None,
        fold_piece_bytes: int | None = None,
    ) -> None:
        if size < 1:
            raise InvalidRankError(f"an in-memory group needs at least one rank, not {size}")
        self.size = size
        self._by_memory = by_memory or (lambda src, dst: False)
        self._fold_piece_bytes = fold_piece_bytes
        # Keyed by (dst, src, tag); each deque is in posting (or sending) order.
        self._posted: dict[tuple[int, int, int], deque[PostedReceive]] = {}
        self._unmatched: dict[tuple[int, int, int], deque[_Message]] = {}
        # For deadlock detection: the tasks that run the ranks (see watch) and
        # the message each of them waits for.
        self._ranks: list[asyncio.Task[Any]] = []
        self._waiting: dict[asyncio.Task[Any], asyncio.Future[Any]] = {}

    def channel(self, rank: int, *, tag: int = 0) -> InMemoryChannel:
        """Rank ``rank``'s channel for the call numbered ``tag`` (calls with
        different tags never take each other's messages)."""
        self._check_rank(rank, "rank")
        return InMemoryChannel(self, rank, tag)

    def link_by_memory(self, src: int, dst: int) -> bool:
        """Whether the link from ``src`` to ``dst`` carries payloads by memory."""
        return self._by_memory(src, dst)

    def pending(self) -> list[str]:
        """Every receive still posted and every message still unmatched, in words
        (empty once every call on the network finished cleanly)."""
        waiting = [
            f"rank {recv.dst} waits for a message from rank {recv.src} (tag {recv.tag})"
            for queue in self._posted.values()
            for recv in queue
        ]
        unmatched = [
            f"rank {m.envelope.src} sent rank {m.envelope.dst} {m.envelope.dtype}{list(m.envelope.shape)} "
            f"(tag {m.envelope.tag}) that no receive took"
            for queue in self._unmatched.values()
            for m in queue
        ]
        return waiting + unmatched

    def watch(self, ranks: list[asyncio.Task[Any]]) -> None:
        """Detect deadlocks among ``ranks``, the tasks that run the ranks.

        Once every one of them that has not finished waits for a message (or
        for a send to be taken) that has not come, none of them will send
        again: their waits fail at once with an
        :class:`~asyncdist.errors.OperationTimeoutError` naming what each
        waits for, instead of hanging.
        """
        self._ranks = ranks
        for task in ranks:
            task.add_done_callback(lambda _: self._fail_if_deadlocked())

    async def wait(self, future: asyncio.Future[T]) -> T:
        """Await a receive's or a send's ``future`` on behalf of the current task."""
        task = asyncio.current_task()
        if future.done() or task is None:
            return await future
        self._waiting[task] = future
        try:
            self._fail_if_deadlocked()
            return await future
        finally:
            del self._waiting[task]

    def _fail_if_deadlocked(self) -> None:
        live = [task for task in self._ranks if not task.done()]
        if not live or any(task not in self._waiting or self._waiting[task].done() for task in live):
            return
        what = "; ".join(self.pending())
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(OperationTimeoutError(f"deadlock in an in-memory group of {self.size}: {what}"))

    # -- what channels call ------------------------------------------------

    def send(self, src: int, dst: int, tag: int, buf: HostBuffer) -> asyncio.Future[None] | None:
        """Start a message; returns its pending send, or None if it is done."""
        self._check_rank(dst, "peer")
        envelope = Envelope(src, dst, tag, buf.dtype, buf.shape)
        if self._by_memory(src, dst):
            message = _Message(envelope, buf.view, asyncio.get_running_loop().create_future())
        else:
            message = _Message(envelope, memoryview(bytes(buf.view)), None)
        key = (dst, src, tag)
        posted = self._posted.get(key)
        if posted:
            recv = posted.popleft()
            if not posted:
                del self._posted[key]
            self._deliver(message, recv)
        else:
            self._unmatched.setdefault(key, deque()).append(message)
        return message.done

    def post(self, recv: PostedReceive) -> None:
        """Match ``recv`` with the earliest unmatched message, or queue it."""
        self._check_rank(recv.src, "peer")
        key = (recv.dst, recv.src, recv.tag)
        unmatched = self._unmatched.get(key)
        if unmatched:
            message = unmatched.popleft()
            if not unmatched:
                del self._unmatched[key]
            self._deliver(message, recv)
        else:
            self._posted.setdefault(key, deque()).append(recv)

    def unpost(self, recv: PostedReceive) -> None:
        """Forget a receive that has not matched (nothing happens if it has)."""
        key = (recv.dst, recv.src, recv.tag)
        queue = self._posted.get(key)
        if queue is not None and recv in queue:
            queue.remove(recv)
            if not queue:
                del self._posted[key]

    def _deliver(self, message: _Message, recv: PostedReceive) -> None:
        """Land ``message`` in ``recv``'s buffer (or fold it in), then complete both."""
        envelope = message.envelope
        try:
            check_fits(
                sent_dtype=envelope.dtype,
                sent_shape=envelope.shape,
                buf=recv.buf,
                sender=f"rank {envelope.src}",
                receiver=f"rank {envelope.dst}",
            )
        except BufferMismatchError as error:
            recv.future.set_exception(error)
        else:
            if recv.fold is None:
                recv.buf.view[:] = message.payload
            else:
                self._fold(recv.fold, np.frombuffer(message.payload, np.uint8), ITEMSIZES[envelope.dtype])
            recv.future.set_result(envelope)
        if message.done is not None and not message.done.done():  # else its sender was cancelled
            message.done.set_result(None)

    def _fold(self, fold: Fold, payload: np.ndarray, itemsize: int) -> None:
        piece = payload.nbytes if self._fold_piece_bytes is None else self._fold_piece_bytes
        piece = max(itemsize, piece // itemsize * itemsize)
        for offset in range(0, payload.nbytes, piece):
            fold(payload[offset : offset + piece], offset)

    def _check_rank(self, rank: int, what: str) -> None:
        if not 0 <= rank < self.size:
            raise InvalidRankError(f"{what} {rank} is not a rank of an in-memory group of {self.size}")


class InMemoryChannel:
    """One rank's :class:`~asyncdist.collectives.channel.Channel` in one call
    on an :class:`InMemoryNetwork` (made by :meth:`InMemoryNetwork.channel`).

    Attributes:
        rank, size: this rank's group rank and the group size.
        tag: the call's number; only channels with the same tag exchange messages.
    """

    __slots__ = ("_network", "rank", "size", "tag")

    def __init__(self, network: InMemoryNetwork, rank: int, tag: int) -> None:
        self._network = network
        self.rank = rank
        self.size = network.size
        self.tag = tag

    def by_memory(self, peer: int, *, sending: bool) -> bool:
        """Whether the link to (``sending``) or from ``peer`` carries payloads by memory."""
        src, dst = (self.rank, peer) if sending else (peer, self.rank)
        return self._network.link_by_memory(src, dst)

    def start_send(self, buf: HostBuffer, peer: int) -> asyncio.Future[None] | None:
        """Start sending ``buf`` to ``peer``; None if the send is done already.

        Raises:
            InvalidRankError: ``peer`` is not another rank of the group.
        """
        self._check_peer(peer)
        return self._network.send(self.rank, peer, self.tag, buf)

    async def wait_send(self, future: asyncio.Future[None] | None, peer: int) -> None:
        """Wait until a send to ``peer`` has been taken by its receive (by-memory links)."""
        if future is not None:
            await self._network.wait(future)

    def start_recv(self, buf: HostBuffer, peer: int, fold: Fold | None = None) -> PostedReceive:
        """Post a receive into ``buf`` from ``peer``, folding with ``fold`` if given.

        Raises:
            InvalidRankError: ``peer`` is not another rank of the group.
        """
        self._check_peer(peer)
        recv = PostedReceive(self.rank, peer, self.tag, buf, fold, asyncio.get_running_loop().create_future())
        self._network.post(recv)
        return recv

    async def wait_recv(self, recv: PostedReceive, peer: int) -> Envelope:
        """Wait for a posted receive; returns the message's :class:`Envelope`.

        Raises:
            BufferMismatchError: the message does not fit the receive buffer.
        """
        try:
            return await self._network.wait(recv.future)
        except asyncio.CancelledError:
            self.withdraw(recv)
            raise

    def withdraw(self, recv: PostedReceive) -> None:
        """Take back a receive that will not be waited for."""
        self._network.unpost(recv)

    async def send(self, buf: HostBuffer, peer: int) -> None:
        """Send ``buf`` to ``peer`` and wait for the send."""
        await self.wait_send(self.start_send(buf, peer), peer)

    async def recv(self, buf: HostBuffer, peer: int) -> Envelope:
        """Receive into ``buf`` from ``peer``."""
        return await self.wait_recv(self.start_recv(buf, peer), peer)

    def _check_peer(self, peer: int) -> None:
        if peer == self.rank:
            raise InvalidRankError(f"rank {peer} sends or receives a message of its own (an algorithm copies locally)")


async def run_ranks(
    size: int,
    algorithm: Callable[[InMemoryChannel], Awaitable[T]],
    *,
    by_memory: Callable[[int, int], bool] | None = None,
    fold_piece_bytes: int | None = None,
    timeout: float = 10.0,
) -> list[T]:
    """Run ``algorithm(channel)`` on every rank of a new in-memory group at once.

    Args:
        size: the number of ranks.
        algorithm: called with each rank's channel; builds that rank's coroutine.
        by_memory, fold_piece_bytes: the network's (see :class:`InMemoryNetwork`).
        timeout: seconds before a run that makes no progress is given up.

    Returns:
        What each rank's coroutine returned, by rank.

    Raises:
        Exception: the first error of a rank, by rank order (the others are cancelled).
        OperationTimeoutError: the ranks deadlocked, or ``timeout`` passed
            (a rank that waits for something else); names every receive still waiting.
        CollectiveMismatchError: every rank returned, but a message was left
            unreceived or a receive unmatched.

    Example:
        >>> async def hello(channel): return channel.rank * 10
        >>> asyncio.run(run_ranks(3, hello))
        [0, 10, 20]
    """
    network = InMemoryNetwork(size, by_memory=by_memory, fold_piece_bytes=fold_piece_bytes)
    tasks = [asyncio.ensure_future(algorithm(network.channel(rank))) for rank in range(size)]
    network.watch(tasks)
    done, pending = await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_EXCEPTION)
    waiting = network.pending()  # before cancelling withdraws the receives
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    errors = [error for error in (task.exception() for task in tasks if task in done) if error is not None]
    if errors:
        raise errors[0]
    if pending:
        raise OperationTimeoutError(f"in-memory group of {size}: no progress in {timeout} s; " + "; ".join(waiting))
    leftover = network.pending()
    if leftover:
        raise CollectiveMismatchError(f"in-memory group of {size}: every rank returned, but " + "; ".join(leftover))
    return [task.result() for task in tasks]

"""MPI message matching: posted receives and unexpected messages (sans-I/O).

A message matches a receive on (context, source, tag); a receive with
``src=None`` matches any source. The rules, as in MPI:

* Two messages from one source with one tag never overtake each other:
  each queue is FIFO and a message is queued (as unexpected) the moment its
  header arrives, before its payload does.
* A message that arrives matches the *earliest posted* receive that fits,
  whether that receive named its source or not.
* A receive that is posted matches the *earliest arrived* unexpected
  message that fits.

This module only keeps the queues; it never touches sockets, futures or
clocks, so its behaviour is tested by feeding it events.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from ..buffers.host import HostBuffer, check_fits
from ..errors import AsyncDistError, BufferMismatchError, CollectiveMismatchError
from ..transport.stream import Fold
from ..wire.frames import Header

__all__ = ["PostedRecv", "Inbound", "Matcher", "misfit", "Fold"]



@dataclass(slots=True, eq=False)
class PostedRecv:
    """A receive waiting for its message.

    Attributes:
        ctx, src, tag: what it matches (``src=None``: any source).
        buf: the destination buffer.
        sources: the global ranks this receive depends on besides ``src``:
            for ``src=None`` the possible senders, for a collective's receive
            the call's other members; losing one of them can fail it.
        op: for a collective, the description of the call; a message whose
            sender was in another call does not fit (``None``: no check).
        future: completed by the engine with the matched :class:`Header`.
        fold: combines the payload into ``buf`` instead of the payload
            overwriting it: called with pieces of the payload (uint8 arrays,
            whole elements) and each piece's byte offset in it, so that a
            reduction reads what arrives once, while it is still in cache,
            and needs no receive buffer of its own (see :func:`asyncdist.reduce.kernels.folder`).
        order: posting order, for choosing between exact and any-source receives.
    """

    ctx: int
    src: int | None
    tag: int
    buf: HostBuffer
    future: Any
    sources: frozenset[int] = frozenset()
    op: str | None = None
    fold: Fold | None = None
    order: int = 0


@dataclass(slots=True, eq=False)
class Inbound:
    """An unexpected message: arrived (or arriving) before its receive was posted.

    ``data`` is a buffer owned by the engine; ``complete`` turns True when the
    whole payload is in it; ``waiter`` is a receive matched to it meanwhile;
    ``failure`` is set when the sender was lost before the payload completed.
    """

    header: Header
    data: Any
    complete: bool = False
    waiter: PostedRecv | None = None
    order: int = 0
    failure: BaseException | None = None


_Key = TypeVar("_Key", tuple[int, int], tuple[int, int, int])


def _remove(table: dict[_Key, deque[PostedRecv]], key: _Key, recv: PostedRecv) -> bool:
    """Remove ``recv`` from ``table[key]``, and the key with its last receive."""
    queue = table.get(key)
    if queue is None or recv not in queue:
        return False
    queue.remove(recv)
    if not queue:
        del table[key]
    return True


class Matcher:
    """The posted and unexpected queues of one rank.

    Attributes:
        unexpected: the unexpected messages by (ctx, src, tag), each key's
            in arrival order; read only (empty: nothing is unexpected).
    """

    __slots__ = ("_posted", "_posted_any", "unexpected", "_unexpected_by_ctx_tag", "_tags", "_counter")

    def __init__(self) -> None:
        self._posted: dict[tuple[int, int, int], deque[PostedRecv]] = {}
        self._posted_any: dict[tuple[int, int], deque[PostedRecv]] = {}
        self.unexpected: dict[tuple[int, int, int], deque[Inbound]] = {}
        # (ctx, tag) -> sources with queued unexpected messages, for src=None.
        self._unexpected_by_ctx_tag: dict[tuple[int, int], set[int]] = {}
        # ctx -> a heap of the tags of its unexpected messages, for take_stale; a tag
        # whose messages were taken since stays until it reaches the top (or none is left).
        self._tags: dict[int, list[int]] = {}
        self._counter = itertools.count()

    # -- receives ----------------------------------------------------------

    def take_unexpected(self, ctx: int, src: int | None, tag: int) -> Inbound | None:
        """Remove and return the earliest unexpected message a new receive matches."""
        if src is not None:
            return self._pop_unexpected((ctx, src, tag))
        sources = self._unexpected_by_ctx_tag.get((ctx, tag))
        if not sources:
            return None
        earliest = min(sources, key=lambda s: self.unexpected[(ctx, s, tag)][0].order)
        return self._pop_unexpected((ctx, earliest, tag))

    def post(self, recv: PostedRecv) -> None:
        """Queue a receive that found no unexpected message."""
        recv.order = next(self._counter)
        if recv.src is None:
            self._posted_any.setdefault((recv.ctx, recv.tag), deque()).append(recv)
        else:
            self._posted.setdefault((recv.ctx, recv.src, recv.tag), deque()).append(recv)

    def unpost(self, recv: PostedRecv) -> bool:
        """Remove a posted receive that has not matched (timeout, cancel)."""
        if recv.src is None:
            return _remove(self._posted_any, (recv.ctx, recv.tag), recv)
        return _remove(self._posted, (recv.ctx, recv.src, recv.tag), recv)

    # -- arrivals ----------------------------------------------------------

    def take_posted(self, header: Header) -> PostedRecv | None:
        """Remove and return the earliest posted receive an arriving message matches."""
        exact_key = (header.ctx, header.src, header.tag)
        any_key = (header.ctx, header.tag)
        exact = self._posted.get(exact_key)
        wildcard = self._posted_any.get(any_key)
        if exact and (not wildcard or exact[0].order < wildcard[0].order):
            recv = exact.popleft()
            if not exact:
                del self._posted[exact_key]
            return recv
        if wildcard:
            recv = wildcard.popleft()
            if not wildcard:
                del self._posted_any[any_key]
            return recv
        return None

    def add_unexpected(self, inbound: Inbound) -> None:
        """Queue a message that matched no posted receive."""
        header = inbound.header
        inbound.order = next(self._counter)
        self.unexpected.setdefault((header.ctx, header.src, header.tag), deque()).append(inbound)
        sources = self._unexpected_by_ctx_tag.setdefault((header.ctx, header.tag), set())
        if not sources:
            heapq.heappush(self._tags.setdefault(header.ctx, []), header.tag)
        sources.add(header.src)

    def _pop_unexpected(self, key: tuple[int, int, int]) -> Inbound | None:
        queue = self.unexpected.get(key)
        if not queue:
            return None
        inbound = queue.popleft()
        if not queue:
            del self.unexpected[key]
            ctx, src, tag = key
            sources = self._unexpected_by_ctx_tag[(ctx, tag)]
            sources.discard(src)
            if not sources:
                del self._unexpected_by_ctx_tag[(ctx, tag)]
            if not self.unexpected:
                self._tags.clear()  # every tag in them was taken
        return inbound

    def drop_call(self, ctx: int, tag: int) -> None:
        """Forget every unexpected message of one call (ctx, tag)."""
        self.take_call_messages(ctx, tag)

    def take_call_messages(self, ctx: int, tag: int) -> list[Inbound]:
        """Remove and return every unexpected message of one call (ctx, tag)
        (a dict lookup when there is none: this runs as every call opens)."""
        taken: list[Inbound] = []
        for src in list(self._unexpected_by_ctx_tag.get((ctx, tag), ())):
            while (inbound := self._pop_unexpected((ctx, src, tag))) is not None:
                taken.append(inbound)
        return taken

    def take_stale(self, ctx: int, below_tag: int) -> Inbound | None:
        """Remove and return an unexpected message in ``ctx`` whose tag is below
        ``below_tag`` (a collective call that no receive of this rank expected):
        the earliest of the lowest such tag.

        Every collective call opening asks while messages are queued, and a root
        that runs ahead leaves one queued per call it is ahead by: the lowest
        tag is looked up, never each queued message (that made a back-to-back
        broadcast's receiver spend 40 % of its time here).
        """
        tags = self._tags.get(ctx)
        while tags and (ctx, tags[0]) not in self._unexpected_by_ctx_tag:
            heapq.heappop(tags)  # its messages were taken since
        if not tags or tags[0] >= below_tag:
            return None
        return self.take_unexpected(ctx, None, tags[0])

    # -- failures ----------------------------------------------------------

    def take_dependents(
        self, rank: int, any_source_fails: Callable[[PostedRecv], bool] = lambda recv: True
    ) -> list[PostedRecv]:
        """Remove and return every posted receive that waits on ``rank``: those
        naming it, and those whose ``sources`` include it (any-source receives,
        collective receives) for which ``any_source_fails`` says the loss is fatal."""
        taken: list[PostedRecv] = []
        for key in [k for k in self._posted if k[1] == rank]:
            taken.extend(self._posted.pop(key))
        for key, queue in list(self._posted.items()):  # named senders, but rank is a co-member
            hit = [r for r in queue if rank in r.sources and any_source_fails(r)]
            if hit:
                keep = deque(r for r in queue if r not in hit)
                taken.extend(hit)
                if keep:
                    self._posted[key] = keep
                else:
                    del self._posted[key]
        for any_key, queue in list(self._posted_any.items()):
            hit = [r for r in queue if rank in r.sources and any_source_fails(r)]
            if not hit:
                continue
            keep = deque(r for r in queue if r not in hit)
            taken.extend(hit)
            if keep:
                self._posted_any[any_key] = keep
            else:
                del self._posted_any[any_key]
        return taken

    def take_call(self, ctx: int, tag: int) -> list[PostedRecv]:
        """Remove and return every posted receive of one call (ctx, tag)."""
        taken: list[PostedRecv] = []
        for key in [k for k in self._posted if k[0] == ctx and k[2] == tag]:
            taken.extend(self._posted.pop(key))
        taken.extend(self._posted_any.pop((ctx, tag), ()))
        return taken

    def take_context(self, ctx: int) -> list[PostedRecv]:
        """Remove and return every posted receive of context ``ctx``, and
        forget its unexpected messages (its group was revoked)."""
        taken: list[PostedRecv] = []
        for key in [k for k in self._posted if k[0] == ctx]:
            taken.extend(self._posted.pop(key))
        for any_key in [k for k in self._posted_any if k[0] == ctx]:
            taken.extend(self._posted_any.pop(any_key))
        for ctx_tag in [k for k in self._unexpected_by_ctx_tag if k[0] == ctx]:
            self.take_call_messages(*ctx_tag)
        return taken

    def take_all(self) -> list[PostedRecv]:
        """Remove and return every posted receive (the engine is closing)."""
        taken = [r for q in self._posted.values() for r in q] + [r for q in self._posted_any.values() for r in q]
        self._posted.clear()
        self._posted_any.clear()
        return taken

    def pending_counts(self) -> tuple[int, int]:
        """(posted receives, unexpected messages), for leak checks and debugging."""
        posted = sum(len(q) for q in self._posted.values()) + sum(len(q) for q in self._posted_any.values())
        return posted, sum(len(q) for q in self.unexpected.values())


def misfit(header: Header, recv: PostedRecv, receiver: int) -> AsyncDistError | None:
    """Why the message ``header`` may not land in ``recv`` on rank ``receiver``,
    or None if it fits: a receive posted by a collective call takes only
    messages of the same call, and the sent dtype and shape must fit its buffer."""
    if recv.op is not None and header.op != recv.op:
        return CollectiveMismatchError(
            f"ranks disagree in collective call #{header.seq}: rank {receiver} called {recv.op}, "
            f"rank {header.src} called {header.op}"
        )
    buf = recv.buf
    if header.dtype == buf.dtype and header.nbytes == buf.nbytes and math.prod(header.shape) == buf.numel:
        return None  # fits: the common case, without building the error's words
    try:
        check_fits(
            sent_dtype=header.dtype,
            sent_shape=header.shape,
            buf=recv.buf,
            sender=f"rank {header.src}",
            receiver=f"rank {receiver}",
        )
    except BufferMismatchError as error:
        return error
    return None

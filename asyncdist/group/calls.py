"""A group's calls: their contexts, their numbers and their deadlines.

Every group has two engine contexts, one for point-to-point messages (the
user's tag is the tag) and one for collectives, where each call takes the
group's next number as its tag, so calls never mix, even when several run
at once on one loop. Every rank creates groups in the same order (as torch
requires), so the contexts agree across ranks without any communication.

:class:`Calls` is the one owner of that numbering, of the calls still open
here (to tell an early message of an open call from a stale one of a
closed call), of reservations (numbers taken now for calls whose channels
open later, see :class:`CallReservation`) and of the group's timeout.
Call numbers start at 1: the first collective a user makes is "call #1".
The world group's startup barrier, which ``init_world`` runs before
returning, is call #0 (``first_call=0``).

**Roots are agreed, or every member learns they are not.** A rank of a
broadcast, reduce, gather or scatter that names another root than the
others would otherwise diverge in silence (two ranks that each broadcast
their own tensor) or wait until the timeout (two ranks that each wait for
the other's). Three checks close this, and cost nothing when the ranks
agree (no message, no wait):

* every data message carries its call's description, root included, and a
  receive refuses a message whose description differs from its own
  (:func:`~asyncdist.engine.matching.misfit`);
* a message of a call that has closed here, which no receive took, is one
  the ranks disagreed about: it fails that call everywhere, as it arrives
  (:meth:`Calls._unexpected_message`) or as the next call opens;
* a rooted call still open :data:`ANNOUNCE_AFTER` seconds after it opened
  *announces* itself: it sends its description, root included, in a
  zero-byte message of the group's announcement context to the root it
  names, or, as the root, to every other member. No receive is ever posted
  there; the engine hands each announcement to :meth:`Calls._announcement`
  as it arrives, which compares it with this rank's description of the same
  call (or keeps it until this rank opens that call).

If the ranks disagree, either some rank is sent a message whose
description differs from its own, or none is and some rank waits for ever:
a non-root waits on a tree parent that names its root too, up to a root
that does not name itself, which hears the waiting rank's announcement; a
root waiting for its children hears from them, or they from it. The rank
that finds the disagreement fails the call and tells the others (an
ABORT); a rank whose part of the call had already completed raises at its
next operation of the group.

**Members are agreed, or every member learns they are not.** Every rank
makes its groups in the same order, so two ranks that pass different member
lists to ``new_group`` get the same contexts, and their collectives would mix
(rank 0 reducing with [0, 1], ranks 1 and 2 with [0, 1, 2]: wrong sums, no
error). So the messages of a group's first collective call carry its
member list in their description ("all_reduce(sum, float32[1]) among ranks
[0, 1]"), which every receive compares with its own; if the call is still
open after :data:`ANNOUNCE_AFTER`, it announces itself to every member (the
lists may leave every rank waiting on another, with no message between two
that disagree). Ranks that disagree get
:class:`~asyncdist.errors.CollectiveMismatchError` naming both lists; a rank
that hears from one outside its own list fails the call there too. Later
calls carry nothing more.

Loop thread only.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections import OrderedDict
from typing import Callable, Iterator

from ..engine.channel import Channel
from ..engine.engine import Engine
from ..engine.operation import Operation
from ..errors import AsyncDistError, CollectiveMismatchError, OperationCancelledError
from ..flight.descriptions import Description, describe
from ..wire.announcements import Announcement
from ..wire.frames import Header
from .members import Members

__all__ = ["Calls", "CallReservation", "ANNOUNCE_AFTER"]

#: Seconds a rooted call may stay open before it announces itself (see the
#: module docstring): far above a small call's time, so that calls that
#: complete never announce, and far below any timeout.
ANNOUNCE_AFTER = 0.05

# Descriptions of finished calls kept, to check announcements that arrive
# late: a rank is at most a few calls ahead of another (each rooted call
# waits for its root), so this many is generous.
_REMEMBERED_CALLS = 256
# How a call failed before it opened here is described (a reserved number never used).
_DEVICE_OPERATION = describe("device operation")

# (Calls, call numbers) the running task's next channels take; see CallReservation. It stays a
# context variable: a staged device call runs the group's own public collective inside the block,
# and the number reaches that collective's channel() without a parameter on every collective.
_RESERVED: contextvars.ContextVar[tuple[Calls, list[int]] | None] = contextvars.ContextVar(
    "asyncdist_reserved_calls", default=None
)


class CallReservation:
    """Collective call numbers taken now, for calls whose channels open later.

    Inside :meth:`active`, the group's ``channel()`` hands out these numbers,
    in order, instead of new ones. :meth:`abandon` fails the numbers never
    used, so the other members' matching calls fail at once (they get an
    ABORT) instead of waiting for their timeout.
    """

    __slots__ = ("_calls", "_seqs")

    def __init__(self, calls: Calls, seqs: list[int]) -> None:
        self._calls, self._seqs = calls, seqs

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Within this block, the running task's channels take the reserved numbers."""
        token = _RESERVED.set((self._calls, self._seqs))
        try:
            yield
        finally:
            _RESERVED.reset(token)

    def abandon(self, error: BaseException) -> None:
        """Fail the numbers not used yet, on every member, with ``error``.

        A cancellation is told to the others as OperationCancelledError
        (they were not cancelled; their call cannot complete); the caller
        re-raises its own CancelledError.
        """
        if not isinstance(error, AsyncDistError):
            error = OperationCancelledError(
                f"rank {self._calls.members.me}: a device operation of group {self._calls.members.name!r} was cancelled"
            )
        seqs, self._seqs[:] = list(self._seqs), []
        for seq in seqs:
            self._calls.fail_call(seq, error)


class Calls:
    """The numbering, contexts and deadlines of one group's operations.

    Args:
        engine: this rank's engine.
        members: the group's members.
        timeout: seconds every operation of the group may take.
        first_call: the number of the group's first call.
        contexts: where its message contexts come from (default: the engine's
            counter; a group made by agreement derives its own).

    Attributes:
        p2p_context: the engine context of the group's point-to-point messages.
        collective_context: the engine context of its collective calls.
        timeout: seconds every operation may take.
    """

    def __init__(
        self,
        engine: Engine,
        members: Members,
        timeout: float,
        first_call: int = 1,
        contexts: Callable[[], int] | None = None,
    ) -> None:
        self.engine = engine
        self.members = members
        self.timeout = timeout
        new_context = contexts or engine.new_context
        self.p2p_context = new_context()
        self.collective_context = new_context()
        self.announcement_context = new_context()
        self._first_call = first_call
        self._last = first_call - 1  # the number of the latest call taken
        self._open: set[int] = set()  # numbered here and not yet finished
        self._described: OrderedDict[int, str] = OrderedDict()  # call -> its description here
        self._late: AsyncDistError | None = None  # raised by the next call (see _aborted)
        engine.watch(self.announcement_context, unmatched=self._announcement)
        engine.watch(self.collective_context, unmatched=self._unexpected_message, aborted=self._aborted)

    # -- numbering -----------------------------------------------------------------

    def channel(self, op: Description | str, root: int | None = None) -> Channel:
        """Open the channel of the next collective call; ``op`` describes the call
        (a string: a call of the user's own, named by it).

        Every member must make its collective calls in the same order: the
        n-th call of each rank is matched with the n-th of the others.

        Args:
            op: the call's description, root included (``describe("broadcast", root=1, ...)``).
            root: the group rank of a rooted call's root (see the module
                docstring: the call announces itself if it takes long); None
                for the others.

        Raises:
            InvalidRankError: this process is not a member.
            CollectiveMismatchError: a message of a call this rank has
                finished is still unclaimed, an announcement of this call
                differs from this rank's, or a call that completed here failed
                elsewhere because the ranks disagreed about it.
            GroupRevokedError: the group was revoked.
        """
        if self.members.rank < 0:
            self.members.check_member()
        engine = self.engine
        if engine.faults.refusing:  # an attribute test per call; the lookup only after a revoke
            revoked = engine.faults.revoked(self.collective_context)
            if revoked is not None:
                raise revoked
        # A message of a call that this rank has closed, and that no receive
        # took, means the ranks disagreed about that call. Calls still open
        # here (numbered, not finished) may legitimately have early messages.
        stale = None
        if engine.unexpected:  # else nothing can be stale or early: the common case, without a call
            stale = engine.take_stale(self.collective_context, min(self._open, default=self._last + 1))
        reserved = _RESERVED.get()
        if reserved is not None and reserved[0] is self and reserved[1]:
            seq = reserved[1].pop(0)
        else:
            seq = self._last = self._last + 1
            self._open.add(seq)
        description = op if isinstance(op, Description) else describe(op)
        text = description.text
        if seq == self._first_call:  # its messages carry the member list, checked once (see the module docstring)
            text = f"{text} among ranks {list(self.members.ranks)}"
        self._described[seq] = text
        if len(self._described) > _REMEMBERED_CALLS:
            self._described.popitem(last=False)
        channel = self._channel(seq, description, on_close=self._open.discard, record=True)  # in the flight recorder
        channel.op = text
        error = None
        if self._late is not None or stale is not None:
            error = self._take_late() or self._stale_error(stale)
        if error is None and engine.unexpected and (queued := engine.take_queued(self.announcement_context, seq)):
            error = self._disagreement(seq, text, queued)
        if error is not None:
            channel.fail(error)  # the other members of this call learn of it now
            self._open.discard(seq)
            raise error
        if root is not None or seq == self._first_call:
            # A group's first call, member list included, announces itself to every member.
            to = self.members.rank if seq == self._first_call else root
            assert to is not None
            channel.if_still_open(ANNOUNCE_AFTER, lambda: self._announce(seq, text, to))
        return channel

    def reserve(self, count: int) -> CallReservation:
        """Number this rank's next ``count`` collective calls now.

        Their channels open later, inside the reservation's ``active()``
        block; calls made meanwhile get later numbers.

        Raises:
            InvalidRankError: this process is not a member.
        """
        self.members.check_member()
        seqs = list(range(self._last + 1, self._last + 1 + count))
        self._last += count
        self._open.update(seqs)
        return CallReservation(self, seqs)

    # -- disagreement -------------------------------------------------------------

    def _stale_error(self, stale: Header | None) -> CollectiveMismatchError | None:
        if stale is None:
            return None
        mine = self._described.get(stale.seq)
        called = f" (rank {self.members.me} called {mine})" if mine is not None else ""
        return CollectiveMismatchError(
            f"rank {self.members.me}: rank {stale.src} sent a message for {stale.op} (call #{stale.seq} in "
            f"group {self.members.name!r}) that no call of this rank expected; the ranks disagreed about that call{called}"
        )

    def _disagreement(self, seq: int, op: str, queued: list[Header]) -> CollectiveMismatchError | None:
        """The first of the announcements of call ``seq`` that arrived before it
        opened here (``queued``) that differs from ``op``."""
        for header in queued:
            theirs = Announcement.of(header)
            if theirs.description != op:
                return self._mismatch(seq, op, theirs)
        return None

    def _mismatch(self, seq: int, op: str, theirs: Announcement) -> CollectiveMismatchError:
        return CollectiveMismatchError(
            f"ranks disagree in collective call #{seq} of group {self.members.name!r}: rank {self.members.me} "
            f"called {op}, rank {theirs.src} called {theirs.description}"
        )

    def _announce(self, seq: int, op: str, root: int) -> None:
        """Tell the root this rank names (or, as the root, every other member) about call ``seq``."""
        m = self.members
        header = Announcement(m.me, self.announcement_context, seq, op).header()
        peers = [r for r in range(m.size) if r != m.rank] if root == m.rank else [root]
        for peer in peers:
            try:
                self.engine.send(m.ranks[peer], header, None)
            except AsyncDistError:
                pass  # a lost peer, a closed group: the call itself fails on it

    def _unexpected_message(self, header: Header) -> bool:
        """A message of one of this group's collective calls arrived before any
        receive took it (engine hook): True keeps it for the receive to come.
        One of a call that has closed here is one the ranks disagreed about:
        the call fails everywhere, and this rank's next one with it."""
        seq = header.tag
        if seq > self._last or seq in self._open:
            return True
        error = self._stale_error(header)
        assert error is not None
        self.fail_call(seq, error)
        self._tell_outsider(header.src, seq, error)
        self._completed_wrongly(error)
        return False

    def _tell_outsider(self, rank: int, seq: int, error: AsyncDistError) -> None:
        """Fail call ``seq`` on global rank ``rank`` too, when it is not a member
        here: it took itself for one (its member list differs), and the ABORT
        that :meth:`fail_call` sends the members would not reach it."""
        if rank not in self.members.ranks:
            self.engine.send_abort([rank], self.collective_context, seq, error)

    def _announcement(self, header: Header) -> bool:
        """An announcement arrived (engine hook): True to keep it until this rank opens its call."""
        theirs = Announcement.of(header)
        seq = theirs.call
        mine = self._described.get(seq)
        if mine is None:
            return seq > self._last or seq in self._open  # not opened here yet (or reserved)
        if theirs.description != mine:
            error = self._mismatch(seq, mine, theirs)
            # Fail it everywhere; if it completed here, on a root other ranks
            # did not name, the next call fails too (not if it failed here).
            completed = seq not in self._open and self.engine.call_error(self.collective_context, seq) is None
            self.fail_call(seq, error)
            self._tell_outsider(theirs.src, seq, error)
            if completed:
                self._completed_wrongly(error)
        return False

    def _aborted(self, seq: int, error: AsyncDistError) -> None:
        """An ABORT for call ``seq`` arrived (engine hook). A call that completed
        here and failed elsewhere because the ranks disagreed about it is
        raised by this rank's next call: its result here may be wrong. (One
        that timed out or lost a peer elsewhere left a right result here.)"""
        completed_here = seq <= self._last and seq not in self._open
        if completed_here and isinstance(error, CollectiveMismatchError):
            self._completed_wrongly(
                CollectiveMismatchError(
                    f"rank {self.members.me}: collective call #{seq} of group {self.members.name!r} completed here "
                    f"but failed on another rank: {error}"
                )
            )

    def _completed_wrongly(self, error: CollectiveMismatchError) -> None:
        """A call that completed here was one the ranks disagreed about: fail
        the calls open now (the next ones), or else the next call to open."""
        if self._open:
            for seq in sorted(self._open):
                self.fail_call(seq, error)
        elif self._late is None:
            self._late = error

    def _take_late(self) -> AsyncDistError | None:
        late, self._late = self._late, None
        return late

    def fail_call(self, seq: int, error: AsyncDistError) -> None:
        """Fail call ``seq`` here and on every other member (an ABORT), whether
        it runs, has not started or has finished here."""
        self._channel(seq, _DEVICE_OPERATION).fail(error)
        self._open.discard(seq)

    def device_operation(self, op: str, what: str) -> Operation:
        """Open a device operation (the copies of staging, an NCCL call): its waits
        for the device end at the group's deadline, on the one timer of every
        operation. Not recorded: the host calls it makes are, and NCCL's are its own."""
        m = self.members
        description = Description(op, text=what)
        return Operation(self.engine, "device", self.collective_context, 0, description, m.name, m.ranks,
                         self.timeout, (), record=False)  # fmt: skip

    def _channel(
        self, seq: int, description: Description, on_close: Callable[[int], None] | None = None, record: bool = False
    ) -> Channel:
        m = self.members
        return Channel(
            self.engine, m.ranks, m.rank, ctx=self.collective_context, seq=seq, description=description,
            timeout=self.timeout, group_name=m.name, on_close=on_close, record=record,
        )  # fmt: skip

"""``Operation``: one call, from the moment it is opened to its completion or failure.

Every call a rank makes, a collective or one point-to-point message, is one
Operation. It holds everything the call is and everything said about it:

* where it belongs: the engine context, the call number (0 for a message),
  the group's name and members (global ranks);
* what it is: its :class:`~asyncdist.flight.descriptions.Description` (op,
  root, reduce op, dtype, shape; a message's peer and tag), made by the
  group layer, never parsed back from a string;
* its deadline and its hang warning, on the rank's one timer of every
  operation (:mod:`~asyncdist.engine.deadlines`): at the deadline, what it
  awaits then fails with its timeout error;
* its progress: the futures it still waits on, by peer, so that a timeout
  (its own, or a ``Work.wait``'s) can say whom it waits for
  (:meth:`Operation.awaited`; it is a :class:`~asyncdist.engine.progress.Step`);
* its flight-recorder record, opened with it and ended by :meth:`Operation.close`.

A collective call's :class:`~asyncdist.engine.channel.Channel` is an
Operation with the algorithms' send and receive. A point-to-point message
is an Operation of kind ``"p2p"`` (call number 0, started at once), sent
with :meth:`Operation.send_payload`, which builds its data header: no layer
above the engine builds a header.

Loop thread only, except :meth:`awaited` and :attr:`where` (any thread:
snapshots, see :mod:`asyncdist.engine.progress`).
"""

from __future__ import annotations

import asyncio
import math
from typing import Any, Callable, Protocol

from ..buffers.host import HostBuffer
from ..errors import CollectiveMismatchError, OperationTimeoutError, PeerLostError
from ..flight import Flight
from ..flight.descriptions import Description
from ..flight.record_ring import CLOCK
from .progress import Awaited, timeout_message
from ..wire.frames import Header, Kind, new_header
from .deadlines import Deadlines

__all__ = ["Operation", "OperationHost", "arm_deadline", "wait_until", "ON_OPEN"]

#: ``ON_OPEN(engine, kind, seq, description)``, called as each recorded operation
#: opens, before anything else: a fault plan's (:mod:`asyncdist.testing.injector`)
#: counts operations there and may kill or pause the rank. None unless a plan is
#: installed (one test of a module global per operation).
ON_OPEN: Callable[[Any, str, int, Description], None] | None = None

# Seconds after which an operation whose deadline passed between two of its waits is asked again.
_NOTHING_AWAITED_RETRY = 0.001
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
    is not done; return what disarms it. For the waits that are not an
    Operation's (an agreement's, a device poll's); an Operation's waits share
    the rank's one timer (:mod:`~asyncdist.engine.deadlines`).

    The error is made before ``withdraw`` (e.g. un-posting a receive) runs, so
    that it can report what was still pending. ``warn``: (loop time, callback)
    called if the future is still pending then, before the deadline (the hang
    warning); it shares the deadline's one timer, so it costs nothing more.
    """
    loop = future.get_loop()
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


class OperationHost(Protocol):
    """What an Operation needs of its engine (:class:`~asyncdist.engine.engine.Engine`)."""

    rank: int
    flight: Flight
    deadlines: Deadlines

    def send(self, dst: int, header: Header, payload: memoryview | None) -> asyncio.Future | None: ...


class Operation:
    """One call of a group, from open to completion (see the module docstring).

    Args:
        engine: this rank's engine.
        kind: "collective", "p2p" for one message, or "device" for a device
            operation's own waits (the copies of staging, an NCCL call).
        ctx: the engine context of its messages.
        seq: its call number in its group (0 for a message).
        description: what it is.
        group_name: its group's name.
        members: the global rank of each group rank.
        timeout: seconds it may take (its deadline is ``timeout`` from now).
        peers: the global ranks it depends on, for its record.
        record: whether the flight recorder records it.
        started: its messages flow at once (a message; a collective starts in ``run``).
        timed: whether the rank's timer watches its deadline (a device
            operation's waits arm their own, :func:`arm_deadline`).

    Attributes:
        deadline: when it fails with OperationTimeoutError (loop time).
        closed: True once it has completed or failed here.
    """

    __slots__ = (
        "_engine", "_ring", "_handle", "_receiving", "_sending", "_warn_at", "_deadlines", "_awaiting", "_withdraw",
        "_later_at", "_later",
        "kind", "ctx", "seq", "description", "group_name", "members", "timeout", "deadline", "closed",
    )  # fmt: skip

    def __init__(
        self,
        engine: OperationHost,
        kind: str,
        ctx: int,
        seq: int,
        description: Description,
        group_name: str,
        members: tuple[int, ...],
        timeout: float,
        peers: tuple[int, ...],
        *,
        record: bool = True,
        started: bool = False,
        timed: bool = True,
    ) -> None:
        if ON_OPEN is not None and record:
            ON_OPEN(engine, kind, seq, description)
        self._engine = engine
        self.kind = kind
        self.ctx = ctx
        self.seq = seq
        self.description = description
        self.group_name = group_name
        self.members = members
        self.timeout = timeout
        self.closed = False
        posted = CLOCK()  # the flight recorder's clock
        self._deadlines = deadlines = engine.deadlines
        now = deadlines.clock()  # the loop's: the same, but on virtual time
        self.deadline = now + timeout
        flight = engine.flight
        hang_warn = flight.hang_warn
        self._warn_at = now + hang_warn if hang_warn else None
        # What it waits on, by future: the group ranks it receives from, or sends to.
        self._receiving: dict[asyncio.Future, tuple[int, ...]] = {}
        self._sending: dict[asyncio.Future, tuple[int, ...]] = {}
        # What it awaits now, which its deadline fails, and what takes it back then.
        self._awaiting: asyncio.Future | None = None
        self._withdraw: Callable[[], Any] | None = None
        self._later_at: float | None = None  # see if_still_open
        self._later: Callable[[], Any] | None = None
        if timed:
            deadlines.open[self] = None
            first = self.deadline if self._warn_at is None else min(self.deadline, self._warn_at)
            if first < deadlines.next_at:
                deadlines.arm(first)
        self._ring = ring = flight.recorder.ring
        nbytes = -1 if description.nbytes is None else description.nbytes
        self._handle = (
            ring.open(kind, ctx, group_name, seq, description, peers, self, posted, posted if started else None, nbytes)
            if record else None
        )  # fmt: skip

    # -- what it is, and what it waits for --------------------------------------------

    @property
    def where(self) -> str:
        """How messages name it: "all_reduce(sum, float32[4]) (call #7 in group 'world')",
        "recv from rank 0 (tag 3, group 'world')"."""
        if self.description.is_message or self.kind == "device":
            return self.description.text
        return f"{self.description.text} (call #{self.seq} in group {self.group_name!r})"

    def is_open(self) -> bool:
        """False once it has completed or failed (a :class:`~asyncdist.engine.progress.Step`)."""
        return not self.closed

    def awaited(self) -> Awaited:
        """The group ranks whose data it still waits for, and those it still sends to
        (any thread: a snapshot)."""
        receiving = {p for future, peers in list(self._receiving.items()) if not future.done() for p in peers}
        sending = {p for future, peers in list(self._sending.items()) if not future.done() for p in peers}
        return Awaited(tuple(sorted(receiving)), tuple(sorted(sending)), self.members)

    def settled(self, future: asyncio.Future) -> None:
        """``future`` no longer counts among what it waits on."""
        self._receiving.pop(future, None)
        self._sending.pop(future, None)

    # -- the deadline and the hang warning, on the rank's one timer -----------------------

    def awaiting(self, future: asyncio.Future, withdraw: Callable[[], Any] | None = None,
                 peers: tuple[int, ...] = (), *, sending: bool = False) -> asyncio.Future:
        """``future`` is what it awaits now; returns it, to be awaited.

        At the deadline, unless it is done by then, ``withdraw`` runs (e.g.
        un-posting a receive, after the error has been worded, so that it can
        say what was still pending) and ``future`` fails with
        :meth:`timeout_error`, naming every peer it waits on. The hang warning
        (``ASYNCDIST_HANG_WARN``) comes from the same timer. ``peers``: the
        group ranks ``future`` waits on, sending to them or receiving from
        them, which :meth:`awaited` reports while it is pending (a message's).
        """
        if peers:
            (self._sending if sending else self._receiving)[future] = peers
        self._awaiting, self._withdraw = future, withdraw
        return future

    def watch(self, future: asyncio.Future, withdraw: Callable[[], Any] | None = None) -> None:
        """:meth:`awaiting` for a future nobody awaits here (an ``isend``'s or
        ``irecv``'s Work); ``withdraw`` also runs if it is cancelled."""
        if future.done():
            return
        self.awaiting(future, withdraw)
        if withdraw is not None:

            def settle(done: asyncio.Future) -> None:
                if done.cancelled():  # a cancelled irecv must not take a later message
                    withdraw()

            future.add_done_callback(settle)

    def if_still_open(self, seconds: float, callback: Callable[[], Any]) -> None:
        """Call ``callback`` if it is still open ``seconds`` from now (on the rank's
        one timer): what a call does only when it takes long (a rooted
        call's announcement, :mod:`asyncdist.group.calls`) costs nothing when it does not."""
        self._later_at, self._later = self._deadlines.clock() + seconds, callback
        deadlines = self._deadlines
        if self._later_at < deadlines.next_at and self in deadlines.open:
            deadlines.arm(self._later_at)

    def due(self, now: float) -> float:
        """The rank's timer asks (:class:`~asyncdist.engine.deadlines.Timed`): call
        back (:meth:`if_still_open`), warn or expire if its time has come by
        ``now``; the next time it needs the timer (inf: none, it has closed or expired)."""
        if self.closed:
            return math.inf
        soonest = self.deadline
        later_at = self._later_at
        if later_at is not None:
            if later_at <= now:
                callback, self._later_at, self._later = self._later, None, None
                assert callback is not None
                callback()
            else:
                soonest = min(soonest, later_at)
        warn_at = self._warn_at
        if warn_at is not None:
            if warn_at <= now:
                self._hang()
            else:
                soonest = min(soonest, warn_at)
        if self.deadline > now:
            return soonest
        future = self._awaiting
        if future is None or future.done():
            return now + _NOTHING_AWAITED_RETRY  # between two waits: expire at the next one
        error = self.timeout_error()
        if self._withdraw is not None:
            self._withdraw()
        future.set_exception(error)
        return math.inf

    def timeout_error(self) -> OperationTimeoutError:
        """Its deadline passed: name it and every peer it still waits on."""
        self._engine.flight.dumps.on_failure(f"operation timeout in {self.where}")
        why = ": the device did not finish its work" if self.kind == "device" else ""
        return OperationTimeoutError(timeout_message(self._engine.rank, self.where, self.timeout, self.awaited(), why=why))

    def _hang(self) -> None:
        """It has waited ``ASYNCDIST_HANG_WARN`` s: ask the peers it waits on where they are."""
        if self._warn_at is None or self.closed:
            return
        since, self._warn_at = self._warn_at - self._engine.flight.hang_warn, None  # once
        awaited = self.awaited()
        peers = [self.members[p] for p in awaited.receiving or awaited.sending]
        if self.description.is_message:
            members = peers  # a message's peers answer with their latest operation of any context
        else:
            members = [rank for rank in self.members if rank != self._engine.rank]
        if members:
            self._engine.flight.whereabouts.warn(self.ctx, self.seq, self.description, self.group_name, members,
                                                 peers, since)  # fmt: skip

    # -- messages and the record --------------------------------------------------------

    def send_payload(self, peer: int, tag: int, buf: HostBuffer) -> asyncio.Future | None:
        """Send ``buf`` to global rank ``peer`` as this message, with the user's
        ``tag``; None if it is already in the kernel."""
        fields = (Kind.DATA, self.ctx, self._engine.rank, tag, 0, buf.dtype, buf.shape, buf.nbytes, "", 0)
        return self._engine.send(peer, new_header(Header, fields), buf.view)

    def follow(self, future: asyncio.Future, peers: tuple[int, ...], *, sending: bool) -> None:
        """A message's one future that nobody awaits here (an ``i*`` call's), waiting on
        ``peers`` as for :meth:`awaiting`: its record ends when the future is done."""
        (self._sending if sending else self._receiving)[future] = peers
        future.add_done_callback(self._followed)

    def _followed(self, done: asyncio.Future) -> None:
        self.close(asyncio.CancelledError("cancelled") if done.cancelled() else done.exception(), dump=False)

    def close(self, error: BaseException | None = None, *, dump: bool = True) -> bool:
        """End it here, completed or failed with ``error``; False if it had ended.

        With ``dump``, a failure that says something went wrong between ranks
        (a mismatch, a lost peer, a timeout) dumps the flight recorder
        (``ASYNCDIST_TRACE_DIR``).
        """
        self.closed = True
        self._deadlines.open.pop(self, None)
        handle = self._handle
        if handle is None:
            return False
        if error is None:
            return bool(self._ring.end(handle))
        flight = self._engine.flight
        if not flight.recorder.close(handle, error):
            return False
        why = next((why for kind, why in _DUMPED.items() if isinstance(error, kind)), None) if dump else None
        if why is not None:  # also when another rank found it and told this one (an ABORT)
            if isinstance(error, PeerLostError):
                flight.recorder.lost.setdefault(error.rank, str(error))
            flight.dumps.on_failure(f"{why} in {self.where}")
        return True

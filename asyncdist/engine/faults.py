"""The engine's part of fault tolerance: control frames of groups, exclusion, revoked contexts.

Revoke, agree and shrink (:mod:`asyncdist.group.fault`) talk in control
frames that bypass MPI matching: a :class:`~asyncdist.wire.control.Revoke`
or :class:`~asyncdist.wire.control.Agree` frame is handed, as it arrives,
to the handler its group registered for the frame's context (the group's
collective context). A frame for a context nobody listens on yet (a group
that a faster rank has made and this rank has not, such as the group a
shrink returns) is kept until its handler comes, within a bound.

Fail-stop is enforced here. A rank that drops a peer it believes dead while
the peer may live (its heartbeat went silent, or an agreement counted it as
failed) first sends it an *expulsion notice*
(:class:`~asyncdist.wire.control.Expel`). A rank that reads one is excluded
from the job: every operation it has pending or starts later fails with
:class:`~asyncdist.errors.RankExcludedError`, so a paused process that wakes
up after the others went on without it cannot form a job of its own.

A revoked context fails every receive of it, now and later, and every send
on it (:meth:`Faults.send_error`), with the group's
:class:`~asyncdist.errors.GroupRevokedError`.

Loop thread only; no sockets here (the engine sends the frames).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Callable

from ..errors import AsyncDistError, ClosedError, PeerLostError, RankExcludedError
from ..wire.control import Agree, ControlFrame, Expel, Revoke, encode_control
from .mailbox import Mailbox

if TYPE_CHECKING:
    from ..transport.stream import Connection

__all__ = ["Faults"]

# Control frames kept for contexts that have no handler yet: a shrink's new group
# gets a few frames per member before it exists everywhere; beyond this, the
# oldest are dropped (a context that never gets a handler must not grow memory).
_MAX_EARLY_FRAMES = 4096

Handler = Callable[[int, Revoke | Agree], None]


class Faults:
    """Control-frame routing, loss watchers, exclusion and revoked contexts of one rank.

    Args:
        rank: this rank.
        mailbox: its mailbox (failed wholesale on exclusion, by context on revoke).
        connections: the engine's live map of peer rank to connection (emptied only by :meth:`crash`).
        lose: the engine's way to drop a peer: fail what depends on it, close its stream.

    Attributes:
        excluded: the error this rank's operations fail with once another rank
            expelled it, else None.
        refusing: True once some sends may be refused (a context revoked, or
            this rank excluded): the engine's one test per message.
    """

    def __init__(
        self,
        rank: int,
        mailbox: Mailbox,
        connections: dict[int, Connection],
        lose: Callable[[int, PeerLostError], None],
    ) -> None:
        self.rank = rank
        self._mailbox = mailbox
        self._connections = connections
        self._lose = lose
        self._handlers: dict[int, Handler] = {}
        self._early: deque[tuple[int, Revoke | Agree]] = deque(maxlen=_MAX_EARLY_FRAMES)
        self._forgotten: set[int] = set()
        self._watchers: list[Callable[[int], None]] = []
        self._revoked: dict[int, AsyncDistError] = {}
        self.excluded: RankExcludedError | None = None
        self.refusing = False

    # -- control frames -----------------------------------------------------------

    def listen(self, ctx: int, handler: Handler) -> Callable[[], None]:
        """Hand every Revoke and Agree frame of context ``ctx`` to ``handler(src, frame)``,
        those kept from before first; returns the function that stops it."""
        self._handlers[ctx] = handler
        early = [item for item in self._early if item[1].ctx == ctx]
        if early:
            self._early = deque((item for item in self._early if item[1].ctx != ctx), maxlen=_MAX_EARLY_FRAMES)
            for src, frame in early:
                handler(src, frame)

        def forget() -> None:
            if self._handlers.get(ctx) is handler:
                del self._handlers[ctx]
                self._forgotten.add(ctx)

        return forget

    def frame(self, src: int, frame: Revoke | Agree | Expel) -> None:
        """A Revoke, Agree or Expel frame arrived from rank ``src``."""
        if isinstance(frame, Expel):
            self.exclude(f"rank {self.rank} was excluded from the job by rank {src}: {frame.reason}")
            return
        handler = self._handlers.get(frame.ctx)
        if handler is not None:
            handler(src, frame)
        elif frame.ctx not in self._forgotten:
            self._early.append((src, frame))

    def send(self, rank: int, frame: ControlFrame) -> bool:
        """Send a control frame to ``rank`` (best effort); False if it is lost."""
        connection = self._connections.get(rank)
        return connection is not None and connection.send_control(frame)

    # -- losses and exclusion -------------------------------------------------------

    def expel(self, rank: int, reason: str, error: PeerLostError | None = None) -> None:
        """Drop ``rank``, counted as failed, sending it an expulsion notice first
        (``reason`` is what it reads; ``error`` what this rank's operations that
        depended on it fail with)."""
        connection = self._connections.get(rank)
        if connection is not None:
            try:
                connection.send_frame(self.notice(reason), None)
            except PeerLostError:
                pass
            connection.discard_unread()  # so that closing sends a FIN after the notice, not a reset
        self._lose(rank, error or PeerLostError(f"rank {self.rank} dropped rank {rank}: {reason}", rank))

    def watch(self, on_loss: Callable[[int], None]) -> Callable[[], None]:
        """Call ``on_loss(rank)`` after each peer's loss, and with this rank's own
        number when it is excluded; returns the function that stops it."""
        self._watchers.append(on_loss)

        def stop() -> None:
            if on_loss in self._watchers:
                self._watchers.remove(on_loss)

        return stop

    def lost(self, rank: int) -> None:
        """Tell the watchers that ``rank`` is lost (the engine, after failing its dependents)."""
        for on_loss in list(self._watchers):
            on_loss(rank)

    def notice(self, reason: str) -> bytes:
        """The encoded expulsion notice that tells a peer why it is dropped."""
        return encode_control(Expel(self.rank, reason))

    def exclude(self, message: str) -> None:
        """This rank is out of the job: fail everything pending, now and later."""
        if self.excluded is not None:
            return
        self.excluded = RankExcludedError(message)
        self.refusing = True
        self._mailbox.fail_all(self.excluded)
        self.lost(self.rank)

    def crash(self) -> None:
        """Reset every connection at once, saying nothing: what the kernel does
        to the sockets of a process killed by SIGKILL (fault-injection tests;
        ``asyncdist.testing.crash``). The engine's ``close`` releases the rest."""
        self._mailbox.fail_all(ClosedError(f"rank {self.rank}: the process crashed"))
        for connection in self._connections.values():
            connection.reset()
        self._connections.clear()

    # -- revoked contexts -----------------------------------------------------------

    def revoke(self, ctx: int, error: AsyncDistError) -> None:
        """Fail every receive and send of context ``ctx`` with ``error``, now and later."""
        self._revoked.setdefault(ctx, error)
        self.refusing = True
        self._mailbox.revoke(ctx, error)

    def send_error(self, ctx: int) -> AsyncDistError | None:
        """Why a message of context ``ctx`` may not be sent (excluded, revoked), or None."""
        if self.excluded is not None:
            return self.excluded
        return self._revoked.get(ctx) if self._revoked else None

    def revoked(self, ctx: int) -> AsyncDistError | None:
        """The error context ``ctx`` was revoked with, or None."""
        return self._revoked.get(ctx) if self._revoked else None

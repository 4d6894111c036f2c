"""Surviving a lost member: ``failed_ranks``, ``revoke``, ``agree`` and ``shrink`` (after ULFM).

The failure model is fail-stop: a member that is lost (its process died,
it closed its group, or it was silent past the heartbeat timeout and was
expelled) never comes back into this group. An operation in flight when a
member is lost may complete on some members and fail on others; the
members decide what to do next with :meth:`FaultTolerance.agree`.

* ``revoke`` floods: the first REVOKE frame a member sees (or its own call)
  makes it forward one to every other member, then fail every pending and
  later operation of the group with :class:`~asyncdist.errors.GroupRevokedError`.
  Since each member forwards once, a revoke reaches every live member even
  when the one who began it dies mid-way, and two revokes at once are one.
* ``agree`` and ``shrink`` run the group's fault-tolerant agreement
  (:mod:`.agreement`) in control frames outside MPI matching, so they work
  on a revoked group. ``shrink`` makes the group of the members not counted
  as failed, ranks renumbered in the old order; its message contexts are
  derived from this group's context and the agreement's number, not taken
  from the engine's counter, so that ranks outside this group (which do not
  shrink it) keep their counters in step with the members'.

Members must call ``agree`` and ``shrink`` in the same order, one at a time.
Loop thread only.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Callable, Generic, Sequence, TypeVar

from ..errors import GroupRevokedError, InvalidArgumentError
from ..timeouts import as_seconds
from ..wire.control import Agree, Revoke
from .agreement import Agreement, Decision
from .calls import Calls
from .contexts import derived_contexts

__all__ = ["FaultTolerance"]

G = TypeVar("G")


class FaultTolerance(Generic[G]):
    """Revoke, agree and shrink for one group.

    Args:
        calls: the group's contexts and timeout.
        make: builds the shrunk group from global ranks, a name, a timeout and
            a context allocator (ProcessGroup's constructor, on the same engine).
    """

    def __init__(self, calls: Calls, make: Callable[[list[int], str, float, Callable[[], int]], G]) -> None:
        self._calls = calls
        self._engine = calls.engine
        self._members = calls.members
        self._make = make
        self._ctx = calls.collective_context
        self.agreement = Agreement(self._engine, self._members, self._ctx)
        self._agreed_failed: frozenset[int] = frozenset()
        self.revoked: GroupRevokedError | None = None
        self._forget = self._engine.faults.listen(self._ctx, self._frame)

    def close(self) -> None:
        """Stop listening (the group is closed)."""
        self._forget()
        self.agreement.close()

    def failed_ranks(self) -> list[int]:
        """The group ranks known lost: those the last agreement counted as
        failed, and those this rank has seen crash or be expelled since, sorted
        (a member that closed its group in order, as at the end of a job, has
        not failed; an agreement still counts it out, since it cannot take part)."""
        lost = self._agreed_failed | self.agreement.failed(crashed=True)
        return sorted(self._members.group_rank(r) for r in lost)

    async def revoke(self) -> None:
        """Revoke the group on every live member; see the module docstring.

        Raises:
            InvalidRankError: this process is not a member.
        """
        self._members.check_member()
        self._revoke(self._members.me)

    async def agree(self, flag: int, *, timeout: timedelta | float | None = None) -> int:
        """The bitwise AND of ``flag`` over the live members, the same on each.

        Raises:
            InvalidArgumentError: ``flag`` is not an int.
            InvalidRankError: this process is not a member.
            RankExcludedError: the others count this rank as failed.
            OperationTimeoutError: no decision within the timeout.
        """
        if not isinstance(flag, int):
            raise InvalidArgumentError(f"agree: flag must be an int, got {flag!r}")
        decision = await self._decide(int(flag), timeout, f"agree({int(flag)})")
        return decision.value

    async def shrink(self, *, exclude: Sequence[int] = (), timeout: timedelta | float | None = None) -> G:
        """The group of the members not counted as failed, in the old order.

        Args:
            exclude: group ranks to count as failed though they may live: they
                are expelled first (torch's ``shrink_group(ranks_to_exclude)``),
                so every member's calls that need them must be complete before
                the first member starts the shrink.

        Raises:
            InvalidRankError: a rank of ``exclude`` is not a group rank, or this
                process is not a member.
            InvalidArgumentError: ``exclude`` names this rank (an excluded rank
                must not take part).
            RankExcludedError, OperationTimeoutError: as for :meth:`agree`.
        """
        m = self._members
        m.check_member()
        excluded = {m.check(r, "shrink: excluded rank") for r in exclude}
        if m.rank in excluded:
            raise InvalidArgumentError(
                f"rank {m.rank} of group {m.name!r} is among the ranks to exclude and must not take part in the "
                "shrink: only the remaining ranks call it (an excluded rank should end its process)")
        for r in sorted(excluded):
            if not self._engine.is_lost(m.ranks[r]):
                self._engine.faults.expel(m.ranks[r], f"rank {m.me} excluded it from group {m.name!r} (shrink)")
        k = self.agreement.peek_number()
        decision = await self._decide(1, timeout, "shrink()")
        survivors = [r for r in m.ranks if r not in decision.failed]
        return self._make(survivors, f"{m.name}/shrunk{k}", self._calls.timeout, derived_contexts(self._ctx, f"s{k}"))

    async def decide(self, flag: int, *, timeout: timedelta | float | None, what: str) -> Decision:
        """The group's next agreement on ``flag``, with the members it counts as
        failed (``agree`` returns only the value; ``grow`` needs both). ``what``
        names the call in messages. Raises as :meth:`agree`."""
        return await self._decide(flag, timeout, what)

    async def _decide(self, flag: int, timeout: timedelta | float | None, what: str) -> Decision:
        self._members.check_member()
        seconds = as_seconds(timeout, default=self._calls.timeout, what=f"{what.split('(')[0]}: timeout")
        decision = await self.agreement.run(flag, seconds, what)
        self._agreed_failed = decision.failed
        return decision

    # -- revoke --------------------------------------------------------------------

    def _revoke(self, by: int) -> None:
        """Forward the revoke to every other member once, then fail the group's operations."""
        if self.revoked is not None:
            return
        m = self._members
        if by == m.me:
            self.revoked = GroupRevokedError(f"rank {m.me}: group {m.name!r} was revoked here", by)
        else:
            self.revoked = GroupRevokedError(f"rank {m.me}: group {m.name!r} was revoked by rank {by}", by)
        frame = Revoke(m.me, self._ctx, by)
        for r in m.others:  # first, so that it overtakes the ABORTs of the calls it fails
            self._engine.faults.send(r, frame)
        calls = self._calls
        for ctx in (calls.p2p_context, calls.collective_context, calls.announcement_context):
            self._engine.faults.revoke(ctx, self.revoked)

    def _frame(self, src: int, frame: Revoke | Agree) -> None:
        if src not in self._members.others:
            return
        if isinstance(frame, Revoke):
            self._revoke(frame.by)
        else:
            self.agreement.frame(src, frame)

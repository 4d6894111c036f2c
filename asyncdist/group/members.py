"""Who is in a group, and how its ranks map onto the job's.

A group numbers its members 0..size-1 (group ranks) in the order it was
made with; the engine knows them by their global ranks. :class:`Members`
translates both ways and owns the one rule for checking a rank argument,
so that every operation words a bad rank the same way. Immutable: a group
that loses or gains members is a new group with new Members.
"""

from __future__ import annotations

from typing import Sequence

from ..errors import InvalidArgumentError, InvalidRankError

__all__ = ["Members"]


class Members:
    """The members of one group, seen from one process.

    Args:
        ranks: the members' global ranks, in group-rank order.
        me: this process's global rank.
        name: the group's name, for messages.

    Attributes:
        ranks: the members' global ranks.
        rank: this process's group rank, -1 if it is not a member.
        size: the number of members.
        name: the group's name.
        me: this process's global rank.
        group_rank_of: each member's group rank by its global rank (read
            directly where the rank is known to be a member's: a message's
            sender; :meth:`group_rank` checks).
    """

    __slots__ = ("ranks", "rank", "size", "name", "me", "group_rank_of", "others")

    def __init__(self, ranks: Sequence[int], me: int, name: str) -> None:
        self.ranks = tuple(ranks)
        self.group_rank_of = {g: i for i, g in enumerate(self.ranks)}
        if len(self.group_rank_of) != len(self.ranks):
            raise InvalidArgumentError(f"group {name!r}: ranks {list(ranks)} contain duplicates")
        self.rank = self.group_rank_of.get(me, -1)
        self.size = len(self.ranks)
        self.name = name
        self.me = me
        #: The other members' global ranks.
        self.others = frozenset(self.ranks) - {me}

    def check(self, rank: object, what: str) -> int:
        """``rank`` if it is a group rank of this group: the one check of a rank argument.

        Args:
            rank: the argument as the caller gave it.
            what: how the message names it ("dst", "src", "new_group: rank").

        Raises:
            InvalidRankError: not an int (a bool is not a rank), negative, or not below ``size``.
        """
        if type(rank) is not int or not 0 <= rank < self.size:
            raise InvalidRankError(f"invalid {what} {rank!r} for group {self.name!r} of size {self.size}")
        return rank

    def global_rank(self, group_rank: int) -> int:
        """The global rank of member ``group_rank``.

        Raises:
            InvalidRankError: not a group rank.
        """
        return self.ranks[self.check(group_rank, "group_rank")]

    def group_rank(self, global_rank: int) -> int:
        """The group rank of global rank ``global_rank``.

        Raises:
            InvalidRankError: that rank is not a member.
        """
        try:
            return self.group_rank_of[global_rank]
        except KeyError:
            raise InvalidRankError(
                f"global rank {global_rank} is not in group {self.name!r} (ranks {list(self.ranks)})"
            ) from None

    def check_member(self) -> None:
        """Raise unless this process is a member.

        Raises:
            InvalidRankError: it is not.
        """
        if self.rank < 0:
            raise InvalidRankError(f"rank {self.me} is not a member of group {self.name!r} (ranks {list(self.ranks)})")

    def peer(self, rank: object, what: str) -> int:
        """The global rank of point-to-point peer ``rank`` ("dst" or "src").

        Raises:
            InvalidRankError: not a member, out of range, or this process's own rank.
        """
        if type(rank) is int and 0 <= rank < self.size and rank != self.rank >= 0:
            return self.ranks[rank]  # the common case, checked without a call
        self.check_member()
        checked = self.check(rank, what)
        if checked == self.rank:
            kind = "destination" if what == "dst" else "source"
            raise InvalidRankError(
                f"Invalid {kind} rank: {kind} rank should not be the same as the rank of the current process "
                f"(rank {checked} in group {self.name!r})"
            )
        return self.ranks[checked]

    def named(self, peer: object, group_peer: object, name: str) -> int | None:
        """The group rank that torch's pair of arguments names, or None if neither is given.

        torch takes a peer either as a global rank (``src``, ``dst``) or as a
        rank within the group (``group_src``, ``group_dst``), not both.

        Args:
            peer: a global rank, or None.
            group_peer: a rank within this group, or None.
            name: the global argument's name ("src", "dst", "peer").

        Raises:
            InvalidArgumentError: both are given.
            InvalidRankError: ``peer`` is not a member, or ``group_peer`` not a group rank.
        """
        if peer is not None and group_peer is not None:
            raise InvalidArgumentError(f"Can only specify one of {name} or group_{name}")
        if group_peer is not None:
            return self.check(group_peer, f"group_{name}")
        if peer is None:
            return None
        if type(peer) is not int:
            raise InvalidRankError(f"{name} must be an int rank, got {peer!r}")
        return self.group_rank(peer)

    def root(self, peer: object, group_peer: object, name: str, default: int | None = None) -> int:
        """Like :meth:`named`, for a root that must be given (or defaults to global rank ``default``).

        Raises:
            InvalidArgumentError: neither is given and there is no default.
        """
        if peer is None and group_peer is None:
            if default is None:
                raise InvalidArgumentError(f"give {name} (a global rank) or group_{name} (a rank within the group)")
            peer = default
        root = self.named(peer, group_peer, name)
        assert root is not None  # one of the two was given
        return root

    def sources(self, src: int | None) -> tuple[int, ...]:
        """The group ranks a receive from ``src`` waits on (every other member for any rank)."""
        return (src,) if src is not None else tuple(r for r in range(self.size) if r != self.rank)

    def who(self, group_ranks: Sequence[int]) -> str:
        """'rank 3' / 'ranks 1, 3', with the global ranks when they differ."""
        words = ("rank " if len(group_ranks) == 1 else "ranks ") + ", ".join(map(str, group_ranks))
        global_ranks = [self.ranks[r] for r in group_ranks]
        if global_ranks != list(group_ranks):
            words += f" (global {', '.join(map(str, global_ranks))})"
        return words

"""Subgroups of a group (await API): ``new_group``, ``split`` and partitions.

A subgroup is a new ProcessGroup over some of the parent's ranks, on the
same engine and sockets: creating one sends nothing. Its message contexts
come from the engine's counter (``engine.new_context()`` in ProcessGroup's
constructor), so they agree across ranks as long as every rank of the job,
member or not, creates the same groups in the same order (torch.distributed
asks the same of ``new_group``). A rank outside the new group still gets a
group object, with ``rank == -1``: keeping it is how the contexts stay in step.

The parent keeps the subgroups made from it in :attr:`Subgroups.groups`
until they are closed, so whoever holds the world holds every group; closing
a subgroup only forgets it (the sockets belong to the engine).

:meth:`Subgroups.split` is MPI's ``MPI_Comm_split``: the one way to make
groups that needs communication (every rank learns the others' colours), and
so the one that non-members need not agree on in advance.

:meth:`Subgroups.split_off` is torch's ``split_group``: only the parent's
members call it, so its groups derive their contexts from the parent's
(:mod:`.contexts`) instead of taking them from the engine's counter.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Awaitable, Callable, Generic, Protocol, Sequence, TypeVar

import numpy as np

from ..errors import InvalidArgumentError
from ..timeouts import as_seconds
from .calls import Calls
from .contexts import derived_contexts

__all__ = ["Subgroups"]


class _Group(Protocol):
    rank: int
    ranks: tuple[int, ...]

    def on_close(self, closer: Callable[[], Any]) -> None: ...


G = TypeVar("G", bound=_Group)


class Subgroups(Generic[G]):
    """The subgroups made from one group.

    Args:
        calls: the parent's numbering and timeouts (for its members and timeout).
        make: builds a group from global ranks, a name, a timeout and a context
            allocator (None: the engine's counter); the ProcessGroup
            constructor, on the parent's engine.
    """

    def __init__(self, calls: Calls, make: Callable[[list[int], str, float, Callable[[], int] | None], G]) -> None:
        self._calls = calls
        self._members = calls.members
        self._make = make
        self._made = 0
        self._splits = 0
        #: The open groups made from this one, oldest first.
        self.groups: list[G] = []

    def new_group(
        self, ranks: Sequence[int] | None = None, *, timeout: timedelta | float | None = None, name: str | None = None
    ) -> G:
        """Create a group of some of this group's ranks; see ProcessGroup.new_group."""
        m = self._members
        members = list(range(m.size)) if ranks is None else list(ranks)
        for r in members:
            m.check(r, "rank")
        seconds = as_seconds(timeout, default=self._calls.timeout, what="new_group: timeout")
        self._made += 1
        child = self._make([m.ranks[r] for r in members], name or f"{m.name}/{self._made}", seconds, None)
        self.keep(child)
        return child

    def keep(self, child: G) -> None:
        """Hold ``child`` among this group's subgroups until it closes."""
        children = self.groups
        children.append(child)
        child.on_close(lambda: children.remove(child) if child in children else None)

    def split_off(
        self, parts: Sequence[Sequence[int]], *, timeout: timedelta | float | None = None, name: str | None = None
    ) -> G | None:
        """torch's ``split_group``: this rank's group among ``parts`` (lists of
        this group's ranks, each sorted), or None if it is in none.

        Only this group's members call it, all with the same parts and in the
        same order as their other splits: the new group's contexts are derived
        (:mod:`.contexts`), so nobody else needs to create it, and nothing is sent.

        Raises:
            InvalidArgumentError: ``parts`` or a part is empty, repeats a rank,
                or two parts share one.
            InvalidRankError: a rank is not a group rank of this group.
        """
        if not parts:
            raise InvalidArgumentError("split_group: split_ranks cannot be None or empty")
        owner: dict[int, int] = {}
        for i, part in enumerate(parts):
            if not part:
                raise InvalidArgumentError("split_group: the split group cannot be empty")
            for r in part:
                self._members.check(r, "split_group: rank")
                if r in owner:
                    raise InvalidArgumentError(f"split_group: rank {r} appears in split {owner[r]} and split {i}")
                owner[r] = i
        self._members.check_member()
        self._splits += 1
        mine = owner.get(self._members.rank)
        if mine is None:
            return None
        m = self._members
        seconds = as_seconds(timeout, default=self._calls.timeout, what="split_group: timeout")
        contexts = derived_contexts(self._calls.collective_context, f"split{self._splits}/{mine}")
        ranks = [m.ranks[r] for r in sorted(parts[mine])]
        child = self._make(ranks, name or f"{m.name}/split{self._splits}", seconds, contexts)
        self.keep(child)
        return child

    def partition(
        self, parts: Sequence[Sequence[int]], *, timeout: timedelta | float | None = None, name: str | None = None
    ) -> tuple[G | None, list[G]]:
        """One group per list of this group's ranks; see ProcessGroup.partition."""
        if not parts:
            raise InvalidArgumentError("partition: the list of parts cannot be empty (ranks_per_subgroup_list in torch)")
        owner: dict[int, list[int]] = {}
        for part in parts:  # every part checked before any group is made
            for r in part:
                self._members.check(r, "rank")
                if r in owner:
                    raise InvalidArgumentError(f"rank {r} appears in both subgroup {owner[r]} and {list(part)}")
                owner[r] = list(part)
        made: list[G] = [self.new_group(part, timeout=timeout, name=name) for part in parts]
        mine = next((g for g in made if g.rank >= 0), None)
        return mine, made

    async def split(
        self,
        all_gather: Callable[[np.ndarray, np.ndarray], Awaitable[Any]],
        color: int | None,
        key: int = 0,
        *,
        timeout: timedelta | float | None = None,
        name: str | None = None,
    ) -> G | None:
        """MPI's ``MPI_Comm_split`` over ``all_gather`` (the group's
        ``all_gather_into_tensor``); see ProcessGroup.split."""
        m, engine = self._members, self._calls.engine
        # Every live rank of the job must take part (a shrunk world qualifies: the rest are lost).
        outside = [r for r in range(engine.world_size) if r not in m.ranks and not engine.is_lost(r)]
        if outside:
            raise InvalidArgumentError(
                f"split: group {m.name!r} has {m.size} of the job's {m.size + len(outside)} ranks; "
                "split the world, or use partition(), which every rank calls"
            )
        if color is not None and (type(color) is not int or color < 0):
            raise InvalidArgumentError(f"split: color must be a non-negative int or None, got {color!r}")
        if type(key) is not int:
            raise InvalidArgumentError(f"split: key must be an int, got {key!r}")
        mine = np.array([-1 if color is None else color, key], np.int64)
        everyone = np.empty(2 * m.size, np.int64)
        await all_gather(everyone, mine)
        pairs = everyone.reshape(m.size, 2)
        parts = self.split_plan(pairs[:, 0], pairs[:, 1])
        if not parts:
            return None
        group, _ = self.partition(parts, timeout=timeout, name=name)
        return group

    def split_plan(self, colors: np.ndarray, keys: np.ndarray) -> list[list[int]]:
        """The parts of ``split``: for each colour >= 0, ascending, its ranks by (key, rank)."""
        parts = []
        for color in sorted({int(c) for c in colors.tolist() if c >= 0}):
            ranks = [r for r in range(self._members.size) if colors[r] == color]
            parts.append(sorted(ranks, key=lambda r: (int(keys[r]), r)))
        return parts

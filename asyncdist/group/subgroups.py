"""Subgroups of a :class:`~asyncdist.group.process_group.ProcessGroup` (await API).

A subgroup is a new ProcessGroup over some of the parent's ranks, on the
same engine and sockets: creating one sends nothing. Its message contexts
come from the engine's counter (``engine.new_context()`` in ProcessGroup's
constructor), so they agree across ranks as long as every rank of the job,
member or not, creates the same groups in the same order (torch.distributed
asks the same of ``new_group``). A rank outside the new group still gets a
group object, with ``rank == -1``: keeping it is how the contexts stay in step.

The parent keeps the subgroups made from it in :attr:`SubgroupMethods.subgroups`
until they are closed, so whoever holds the world holds every group; closing
a subgroup only forgets it (the sockets belong to the engine).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Sequence

from ..errors import InvalidArgumentError, InvalidRankError

__all__ = ["SubgroupMethods"]


class SubgroupMethods:
    """Mixin: creating subgroups. Needs ``ranks``, ``size``, ``name``, ``timeout``, ``on_close()``."""

    ranks: tuple[int, ...]
    size: int
    name: str
    timeout: float

    @property
    def subgroups(self) -> list[Any]:
        """The open groups created from this one with :meth:`new_group`, oldest first."""
        return self.__dict__.setdefault("_subgroups", [])

    def new_group(
        self, ranks: Sequence[int] | None = None, *, timeout: timedelta | float | None = None, name: str | None = None
    ) -> Any:
        """Create a group of some of this group's ranks (a plain call: nothing is sent).

        Loop thread only. Every rank of the job, member or not, must create
        the same groups in the same order.

        Args:
            ranks: the members, as ranks of *this* group, in the new group's
                rank order (None: all of this group's ranks).
            timeout: seconds (or a ``timedelta``) every operation of the new
                group may take; None: this group's timeout.
            name: the new group's name in error messages.

        Returns:
            The new :class:`~asyncdist.group.process_group.ProcessGroup`; its ``rank`` is -1
            on ranks that are not members.

        Raises:
            InvalidRankError: a rank is not an int in ``[0, size)``.
            InvalidArgumentError: ``ranks`` repeats a rank, or ``timeout`` is not positive.

        Example::

            pair = world.new_group([0, 1])
            if pair.rank >= 0:
                await pair.all_reduce(x)
        """
        members = list(range(self.size)) if ranks is None else list(ranks)
        for r in members:
            if type(r) is not int or not 0 <= r < self.size:
                raise InvalidRankError(f"new_group: rank {r!r} is not a rank of group {self.name!r} of size {self.size}")
        seconds = self.timeout if timeout is None else _seconds(timeout)
        if not seconds > 0:
            raise InvalidArgumentError(f"new_group: timeout must be positive, got {timeout!r}")
        global_ranks = [self.ranks[r] for r in members]
        count = self.__dict__.get("_subgroups_made", 0) + 1
        self.__dict__["_subgroups_made"] = count
        # type(self): the ProcessGroup class, which imports this module (no cycle).
        child = type(self)(self._engine, global_ranks, name=name or f"{self.name}/{count}", timeout=seconds)  # type: ignore[call-arg, attr-defined]
        children = self.subgroups
        children.append(child)
        child.on_close(lambda: children.remove(child) if child in children else None)
        return child


def _seconds(timeout: timedelta | float) -> float:
    return timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)

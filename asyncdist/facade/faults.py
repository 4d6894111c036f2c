"""The blocking facade's fault tolerance: torch 2.13's ``shrink_group``, and ``agree``, ``revoke``, ``failed_ranks``.

torch's ``shrink_group`` works only on NCCL. Here it is the await API's
:meth:`~asyncdist.group.process_group.ProcessGroup.shrink`: the remaining
ranks agree on who is left, even if another rank dies meanwhile, and get a
group of those ranks, renumbered in the old order. torch's rules are kept:

* only the remaining ranks call it; an excluded rank that calls it gets a
  clear error (and is not waited for);
* shrinking the default group makes the new group the default
  (``get_rank()`` and ``get_world_size()`` follow it) and destroys every
  other group, whose ranks no longer mean what they did;
* shrinking another group destroys that group.

asyncdist adds one convenience: ``shrink_group()`` with no
``ranks_to_exclude`` excludes the ranks known to be lost, so a loop that
survives a crash needs no bookkeeping of its own (see ``docs/fault-tolerance.md``).
torch has no ``agree``, ``revoke`` or ``failed_ranks``; they are the await
API's group methods, here as blocking calls, because a loop that survives
needs ``agree`` to decide whether a step happened on every rank.

Thread affinity: any thread but asyncdist's loop thread.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from ..errors import InvalidArgumentError
from ..group.process_group import ProcessGroup
from .lifecycle import Group, _group, _portal, _runtime, _world

__all__ = ["shrink_group", "agree", "revoke", "failed_ranks", "SHRINK_DEFAULT", "SHRINK_ABORT"]

#: torch's flags: go on from where the group is, or first abort the operations
#: still pending on it (here: revoke the group, on every member).
SHRINK_DEFAULT = 0x00
SHRINK_ABORT = 0x01


def shrink_group(
    ranks_to_exclude: list[int] | None = None,
    group: Group = None,
    shrink_flags: int = SHRINK_DEFAULT,
    pg_options: Any = None,
) -> ProcessGroup:
    """A new group of ``group``'s ranks but ``ranks_to_exclude`` and those lost (torch's ``shrink_group``).

    Any thread but asyncdist's loop thread. Every remaining rank calls it;
    the excluded ranks must not (they are dropped from the job: an operation
    of theirs fails with :class:`~asyncdist.errors.RankExcludedError`).

    Args:
        ranks_to_exclude: group ranks of ``group`` to leave out. None: the
            ranks known lost (``group.failed_ranks()``); ranks that the others
            know lost are left out either way.
        group: the group to shrink (default: the default group, which the new
            group then replaces; every other group is destroyed).
        shrink_flags: ``SHRINK_DEFAULT``, or ``SHRINK_ABORT`` to revoke the
            group first, failing the operations still pending on it.
        pg_options: accepted for torch compatibility; unused.

    Returns:
        The new group (for the default group: the new default group).

    Raises:
        InvalidArgumentError: a bad flag, an empty list, a rank out of range
            or repeated, every rank excluded, a group of one rank, ``group`` this rank is
            not in; or this rank is in ``ranks_to_exclude`` (torch's
            RuntimeError: an InvalidArgumentError is a RuntimeError too).
        RankExcludedError: the other ranks excluded this one.

    Example::

        try:
            dist.all_reduce(grads)
        except dist.DistError:
            dist.shrink_group(shrink_flags=dist.SHRINK_ABORT)   # the lost ranks are left out
    """
    world = _world()
    target = _in(group, "shrink_group")
    if shrink_flags not in (SHRINK_DEFAULT, SHRINK_ABORT) or type(shrink_flags) is not int:
        raise InvalidArgumentError(
            f"Invalid shrink_flags value: {shrink_flags!r}. Must be one of: SHRINK_DEFAULT ({SHRINK_DEFAULT}) "
            f"or SHRINK_ABORT ({SHRINK_ABORT})")
    if target.size <= 1:
        raise InvalidArgumentError(f"Cannot shrink a process group with size {target.size}")
    exclude = _checked(ranks_to_exclude, target)

    async def shrink() -> ProcessGroup:
        if shrink_flags == SHRINK_ABORT:
            await target.revoke()
        new = await target.shrink(exclude=exclude)
        await _retire(world, target, new)
        return new

    new = _portal().run(shrink(), what="shrink_group()")
    if target is world:
        _runtime.world = new
    return new


def agree(flag: int, group: Group = None, timeout: timedelta | float | None = None) -> int:
    """The bitwise AND of ``flag`` over the live ranks of ``group``, the same on each (blocking).

    Any thread but asyncdist's loop thread. Every live rank of the group
    calls it, in the same order as its ``shrink_group`` calls; it works on a
    revoked group. See :meth:`asyncdist.group.process_group.ProcessGroup.agree`.

    Raises:
        InvalidArgumentError: ``flag`` is not an int, or this rank is not in ``group``.
        RankExcludedError: the other ranks excluded this one.
        OperationTimeoutError: no decision within ``timeout`` (None: the group's).

    Example::

        try:
            dist.all_reduce(grads)
            ok = 1
        except dist.DistError:
            ok = 0
        if not dist.agree(ok):               # the same answer on every live rank
            dist.shrink_group(shrink_flags=dist.SHRINK_ABORT)
    """
    target = _in(group, "agree")
    return _portal().run(target.agree(flag, timeout=timeout), what="agree()")


def revoke(group: Group = None) -> None:
    """Fail every pending and later operation of ``group`` on every live rank
    (:class:`~asyncdist.errors.GroupRevokedError`); ``agree`` and ``shrink_group`` still work.

    Raises:
        InvalidArgumentError: this rank is not in ``group``.
    """
    target = _in(group, "revoke")
    _portal().run(target.revoke(), what="revoke()")


def failed_ranks(group: Group = None) -> list[int]:
    """The ranks of ``group`` known lost, sorted (see
    :meth:`asyncdist.group.process_group.ProcessGroup.failed_ranks`). Any thread."""
    return _in(group, "failed_ranks").failed_ranks()


def _in(group: Group, what: str) -> ProcessGroup:
    target = _group(group)
    if target is None or target.rank < 0:
        raise InvalidArgumentError(f"{what}: rank {_world().engine.rank} is not in the group")
    return target


def _checked(ranks: list[int] | None, target: ProcessGroup) -> list[int]:
    """torch's checks of ``ranks_to_exclude`` (None: the ranks known lost)."""
    if ranks is None:
        return target.failed_ranks()
    if not isinstance(ranks, list):
        raise InvalidArgumentError(f"ranks_to_exclude must be a list of group ranks, but got {ranks!r}")
    if not ranks:
        raise InvalidArgumentError(
            "ranks_to_exclude cannot be empty; leave it out (None) to exclude the ranks known to be lost")
    seen: set[int] = set()
    for i, rank in enumerate(ranks):
        if type(rank) is not int or not 0 <= rank < target.size:
            raise InvalidArgumentError(
                f"Rank {rank!r} at index {i} is out of bounds for group size {target.size}. "
                f"Valid ranks are in range [0, {target.size - 1}].")
        if rank in seen:
            raise InvalidArgumentError(f"Duplicate rank {rank} found in ranks_to_exclude at index {i}")
        seen.add(rank)
    if len(seen) >= target.size:
        raise InvalidArgumentError(f"Cannot exclude all {target.size} ranks from process group")
    return ranks


async def _retire(world: ProcessGroup, old: ProcessGroup, new: ProcessGroup) -> None:
    """Destroy what the shrink made stale: for the default group, every other
    group; else the old group, whose place among its parent's groups the new
    one takes. (The old group's sockets and engine now belong to the new one.)"""
    if old is world:
        stale = _descendants(world)
    else:
        stale = []
        for holder in [world, *_descendants(world)]:
            if old in holder.subgroups.groups:
                holder.subgroups.groups.remove(old)
                holder.subgroups.keep(new)
    await asyncio.gather(*(group.close() for group in [old, *stale] if group is not new), return_exceptions=True)
    if old is world:
        world.subgroups.groups.clear()


def _descendants(group: ProcessGroup) -> list[ProcessGroup]:
    found, pending = [], list(group.subgroups.groups)
    while pending:
        sub = pending.pop()
        found.append(sub)
        pending.extend(sub.subgroups.groups)
    return found

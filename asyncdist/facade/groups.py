"""The blocking facade's groups: ``new_group`` and friends, as torch.distributed has them.

Groups are made by the await API (:meth:`ProcessGroup.new_group
<asyncdist.group.process_group.ProcessGroup.new_group>`) on the loop thread;
nothing is sent, so every rank of the job must create the same groups in the
same order, members or not (torch asks the same). The world group keeps the
groups made from it, so the facade's one piece of state (the world) holds
them all: ``destroy_process_group()`` needs nothing more, and
``destroy_process_group(subgroup)`` just forgets the subgroup.

torch's conventions kept here: ``new_group`` returns
``GroupMember.NON_GROUP_MEMBER`` (the int -100) on ranks outside the group,
and every facade call accepts that as ``group`` and does nothing; ranks are
sorted unless ``sort_ranks=False``; ``GroupMember.WORLD`` is the default
group (None before ``init_process_group``).

Thread affinity: any thread but asyncdist's loop thread.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Sequence

from .. import settings
from .._torch import torch_or_none
from ..errors import InvalidArgumentError, RendezvousError
from .lifecycle import NON_GROUP_MEMBER, Group, _check_backend, _group, _portal, _runtime, _use_backend, _world
from ..group.process_group import ProcessGroup

__all__ = [
    "GroupMember",
    "group",
    "new_group",
    "new_subgroups",
    "new_subgroups_by_enumeration",
    "split_group",
    "get_group_rank",
    "get_global_rank",
    "get_process_group_ranks",
    "get_node_local_rank",
    "is_torchelastic_launched",
]


class _WorldMeta(type):
    @property
    def WORLD(cls) -> ProcessGroup | None:  # noqa: N802 (torch's name)
        """The default (world) group; None before ``init_process_group``."""
        return _runtime.world


class GroupMember(metaclass=_WorldMeta):
    """torch's ``GroupMember``: ``WORLD`` (the default group) and ``NON_GROUP_MEMBER``."""

    NON_GROUP_MEMBER = NON_GROUP_MEMBER


class group(metaclass=_WorldMeta):  # noqa: N801 (torch's name: dist.group.WORLD)
    """torch's ``dist.group``: ``group.WORLD`` is the default group."""


def new_group(
    ranks: Sequence[int] | None = None,
    timeout: timedelta | None = None,
    backend: str | None = None,
    pg_options: Any = None,
    use_local_synchronization: bool = False,
    group_desc: str | None = None,
    device_id: Any = None,
    sort_ranks: bool = True,
) -> ProcessGroup | int:
    """Create a group of some of the world's ranks; every rank must call it, in the same order.

    Any thread but asyncdist's loop thread (there it raises WrongThreadError).

    Nothing is sent: the call returns at once on every rank.

    Args:
        ranks: the members' global ranks (None: every rank).
        timeout: bound on each operation of the group (a ``timedelta`` or
            seconds); None: the world's timeout (torch uses its 30 min default).
        backend: as for ``init_process_group`` (None: the default group's);
            ``"nccl"`` sends the group's CUDA tensors through its own NCCL
            communicator.
        pg_options, device_id: accepted for torch compatibility; unused on CPU.
        use_local_synchronization: must be False (see Raises).
        group_desc: the group's name in error messages.
        sort_ranks: sort ``ranks`` first, as torch does; with False the
            group ranks follow the order given.

    Returns:
        The group on its members; ``GroupMember.NON_GROUP_MEMBER`` elsewhere.

    Raises:
        InvalidRankError: a rank is not an int in ``[0, world size)``.
        InvalidArgumentError: a repeated rank; an unsupported ``backend``;
            ``use_local_synchronization=True`` (asyncdist agrees on a group's
            identity by the order in which every rank creates groups, so
            non-members must call too).

    Example::

        pair = dist.new_group([0, 1])
        dist.all_reduce(t, group=pair)   # ranks 2, 3, ...: returns None, t unchanged
    """
    world = _world()
    if backend is not None:
        _check_backend(backend)
    else:  # torch: the default group's backend
        backend = _runtime.backend
    if use_local_synchronization:
        raise InvalidArgumentError(
            "use_local_synchronization=True is not supported: every rank must call new_group, in the same order"
        )
    members = list(range(world.size)) if ranks is None else list(ranks)
    if sort_ranks:
        members = _sorted(members)

    def create() -> ProcessGroup:
        sub = world.new_group(members, timeout=timeout, name=group_desc)
        _keep_or_forget(world, sub, backend)
        return sub

    sub = _portal().call(create, what="new_group()")
    return sub if sub.rank >= 0 else NON_GROUP_MEMBER


def new_subgroups(
    group_size: int | None = None,
    group: Group = None,
    timeout: timedelta | None = None,
    backend: str | None = None,
    pg_options: Any = None,
    group_desc: str | None = None,
) -> tuple[ProcessGroup | None, list[ProcessGroup | int]]:
    """Split ``group`` into consecutive subgroups of ``group_size`` ranks (every rank calls it).

    Any thread but asyncdist's loop thread (there it raises WrongThreadError).

    Args:
        group_size: ranks per subgroup; must divide the group's size. None:
            the number of CUDA devices (an error without CUDA, as in torch).
        group: the group to split (default: the world).
        timeout, backend, pg_options, group_desc: as for :func:`new_group`.

    Returns:
        ``(cur_subgroup, subgroups)``: this rank's subgroup, and every
        subgroup (``NON_GROUP_MEMBER`` for those this rank is not in).

    Raises:
        InvalidArgumentError: ``group_size`` missing, not positive, larger than
            or not dividing the group's size.

    Example::

        mine, _ = dist.new_subgroups(group_size=2)   # [0, 1], [2, 3], ...
    """
    if group_size is None:
        torch = torch_or_none()
        if torch is None or not torch.cuda.is_available():
            raise InvalidArgumentError("new_subgroups: without CUDA, give group_size (the default is the CUDA device count)")
        group_size = torch.cuda.device_count()
    ranks = get_process_group_ranks(group)
    if type(group_size) is not int or group_size <= 0:
        raise InvalidArgumentError(f"new_subgroups: group_size must be a positive int, got {group_size!r}")
    if len(ranks) < group_size or len(ranks) % group_size:
        raise InvalidArgumentError(f"new_subgroups: group_size {group_size} must divide the group's size {len(ranks)}")
    chunks = [ranks[i : i + group_size] for i in range(0, len(ranks), group_size)]
    return new_subgroups_by_enumeration(chunks, timeout, backend, pg_options, group_desc)


def new_subgroups_by_enumeration(
    ranks_per_subgroup_list: Sequence[Sequence[int]],
    timeout: timedelta | None = None,
    backend: str | None = None,
    pg_options: Any = None,
    group_desc: str | None = None,
) -> tuple[ProcessGroup | None, list[ProcessGroup | int]]:
    """Create one subgroup per list of global ranks (every rank calls it).

    Any thread but asyncdist's loop thread (there it raises WrongThreadError).

    Args:
        ranks_per_subgroup_list: disjoint lists of global ranks; ranks in no
            list are in no subgroup.
        timeout, backend, pg_options, group_desc: as for :func:`new_group`.

    Returns:
        ``(cur_subgroup, subgroups)``: this rank's subgroup (None if in none),
        and every subgroup (``NON_GROUP_MEMBER`` for those this rank is not in).

    Raises:
        InvalidArgumentError: the list is empty or two lists share a rank
            (checked before any group is created).
        InvalidRankError: as for :func:`new_group`.
    """
    world = _world()
    backend = _runtime.backend if backend is None else _check_backend(backend)
    parts = [_sorted(ranks) for ranks in ranks_per_subgroup_list]

    def create() -> tuple[ProcessGroup | None, list[ProcessGroup]]:
        mine, made = world.partition(parts, timeout=timeout, name=group_desc)
        for sub in made:
            _keep_or_forget(world, sub, backend)
        return mine, made

    mine, made = _portal().call(create, what="new_subgroups_by_enumeration()")
    return mine, [sub if sub.rank >= 0 else NON_GROUP_MEMBER for sub in made]


def split_group(
    parent_pg: Group = None,
    split_ranks: list | None = None,
    timeout: timedelta | None = None,
    pg_options: Any = None,
    group_desc: str | None = None,
    backend: str | None = None,
) -> ProcessGroup | None:
    """Split ``parent_pg`` into disjoint groups and return this rank's (torch's ``split_group``).

    Any thread but asyncdist's loop thread (there it raises WrongThreadError).
    As in torch, every rank of the parent calls it, with the same
    ``split_ranks``, and no other rank needs to (the new groups' message
    contexts are derived from the parent's: :mod:`asyncdist.group.contexts`).
    Nothing is sent.

    Args:
        parent_pg: the group to split (default: the default group).
        split_ranks: disjoint lists of *group ranks of the parent*, as in
            torch; each list is sorted; ranks in no list are in no new group.
        timeout, pg_options, group_desc, backend: as for :func:`new_group`.

    Returns:
        This rank's new group; None if it is in none.

    Raises:
        InvalidArgumentError: ``split_ranks`` missing or empty, an empty or
            repeating list, two lists sharing a rank, or this rank not in the
            parent (torch's ValueErrors).
        InvalidRankError: a rank is not a group rank of the parent.
    """
    world = _world()
    if not split_ranks:
        raise InvalidArgumentError("split_ranks cannot be None or empty")
    backend = _runtime.backend if backend is None else _check_backend(backend)
    parent = _group(parent_pg)
    if parent is None or parent.rank < 0:
        name = parent.name if parent is not None else "NON_GROUP_MEMBER"
        raise InvalidArgumentError(f"Global rank {world.engine.rank} is not part of the parent group {name!r}")
    parts = [list(ranks) for ranks in split_ranks]

    def create() -> ProcessGroup | None:
        mine = parent.subgroups.split_off(parts, timeout=timeout, name=group_desc)
        if mine is not None:
            _use_backend(mine, backend, world.store)
        return mine

    return _portal().call(create, what="split_group()")


def _sorted(ranks: Sequence[int]) -> list[int]:
    """``ranks`` in order, as torch sorts a new group's ranks (left as they are
    if they are not all ints: the group's check then names the bad one)."""
    return sorted(ranks) if all(type(r) is int for r in ranks) else list(ranks)


def _keep_or_forget(world: ProcessGroup, sub: ProcessGroup, backend: Any) -> None:
    """Loop thread: a new group this rank is in gets the backend's CUDA path;
    one it is not in is forgotten (the caller gets NON_GROUP_MEMBER)."""
    if sub.rank < 0:
        world.subgroups.groups.remove(sub)
    else:
        _use_backend(sub, backend, world.store)


def _members(group: Group, what: str) -> ProcessGroup:
    g = _group(group)
    if g is None:
        raise InvalidArgumentError(f"{what}: GroupMember.NON_GROUP_MEMBER stands for a group this rank is not in; it has no ranks")
    return g


def get_group_rank(group: Group, global_rank: int) -> int:
    """The rank within ``group`` of global rank ``global_rank`` (identity for the world).

    Any thread (a lookup; nothing is sent).

    Raises:
        InvalidRankError: ``global_rank`` is not in ``group`` (a ValueError, as torch's).
    """
    return _members(group, "get_group_rank").group_rank(global_rank)


def get_global_rank(group: Group, group_rank: int) -> int:
    """The global rank of ``group``'s rank ``group_rank`` (identity for the world).

    Any thread (a lookup; nothing is sent).

    Raises:
        InvalidRankError: ``group_rank`` is not in ``[0, group size)``.
    """
    return _members(group, "get_global_rank").global_rank(group_rank)


def get_process_group_ranks(group: Group) -> list[int]:
    """The global ranks of ``group``'s members, by group rank (None: the world).

    Any thread (a lookup; nothing is sent).
    """
    return list(_members(group, "get_process_group_ranks").ranks)


def get_node_local_rank(fallback_rank: int | None = None) -> int:
    """This process's rank on its node, from ``LOCAL_RANK`` (set by launchers).

    Args:
        fallback_rank: returned when ``LOCAL_RANK`` is unset.

    Raises:
        RendezvousError: ``LOCAL_RANK`` is unset and no ``fallback_rank`` was given.
    """
    environ = settings.refresh().environ  # read at each call, as torch's is
    if "LOCAL_RANK" in environ:
        return int(environ["LOCAL_RANK"])
    if fallback_rank is not None:
        return int(fallback_rank)
    raise RendezvousError(
        "LOCAL_RANK is not in the environment; pass fallback_rank to run without a launcher that sets it"
    )


def is_torchelastic_launched() -> bool:
    """True if a torchelastic-style launcher started this process (``TORCHELASTIC_RUN_ID`` is set)."""
    return "TORCHELASTIC_RUN_ID" in settings.refresh().environ  # read at each call, as torch's is

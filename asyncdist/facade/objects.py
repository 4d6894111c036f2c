"""The blocking facade's object collectives (``*_object*``), with torch.distributed's signatures.

Shells over :mod:`asyncdist.group.objects` (see there for how objects travel
and why unpickling them is safe: only peers that passed the authenticated
handshake can send). As in torch, these calls block (no ``async_op``) and a
rank outside ``group`` returns at once without touching its lists.
``device`` and ``use_batch`` are accepted for compatibility; objects travel
as CPU bytes.

Thread affinity: any thread but asyncdist's loop thread.
"""

from __future__ import annotations

from typing import Any

from ..group.process_group import ProcessGroup
from .collectives import _submit
from .lifecycle import Group

__all__ = [
    "broadcast_object_list",
    "all_gather_object",
    "gather_object",
    "scatter_object_list",
    "send_object_list",
    "recv_object_list",
]


def broadcast_object_list(
    object_list: list, src: int | None = None, group: Group = None, device: Any = None, group_src: int | None = None
) -> None:
    """Replace the items of ``object_list`` on every rank with those of ``src`` (in place).

    Any thread but asyncdist's loop thread (there it raises WrongThreadError).

    Args:
        object_list: on ``src`` the picklable objects to send; elsewhere a
            list of the same length whose items are replaced.
        src: the source's global rank (default 0; or give ``group_src``).
        group: the process group (default: the world).
        device: accepted for torch compatibility; unused.
        group_src: the source's rank within ``group``.

    Returns:
        None.

    Raises:
        InvalidRankError: ``src`` is not in ``group``.
        CollectiveMismatchError: the lists' lengths differ between ranks.
        PeerLostError, OperationTimeoutError: a rank is gone or too slow.

    Example::

        objs = [{"lr": 0.1}, "resnet"] if dist.get_rank() == 0 else [None, None]
        dist.broadcast_object_list(objs, src=0)
    """
    _submit(group, "broadcast_object_list", lambda g: g.broadcast_object_list(object_list, g.members.root(src, group_src, "src", 0)), False)


def all_gather_object(object_list: list, obj: Any, group: Group = None) -> None:
    """Every rank's ``obj`` lands in ``object_list[rank]`` on every rank.

    Any thread but asyncdist's loop thread (there it raises WrongThreadError).

    Args:
        object_list: one slot per group rank; its items are replaced.
        obj: this rank's picklable object.
        group: the process group (default: the world).

    Returns:
        None.

    Raises:
        InvalidArgumentError: ``object_list`` does not have one item per rank.
        PeerLostError, OperationTimeoutError: a rank is gone or too slow.
    """
    _submit(group, "all_gather_object", lambda g: g.all_gather_object(object_list, obj), False)


def gather_object(
    obj: Any, object_gather_list: list | None = None, dst: int | None = None, group: Group = None, group_dst: int | None = None
) -> None:
    """Every rank's ``obj`` lands in ``object_gather_list[rank]`` on ``dst``.

    Any thread but asyncdist's loop thread (there it raises WrongThreadError).

    Args:
        obj: this rank's picklable object.
        object_gather_list: on ``dst``, one slot per group rank; elsewhere None.
        dst: the destination's global rank (default 0; or give ``group_dst``).
        group: the process group (default: the world).
        group_dst: the destination's rank within ``group``.

    Returns:
        None.

    Raises:
        InvalidArgumentError: ``object_gather_list`` is wrong for this rank.
        InvalidRankError: ``dst`` is not in ``group``.
        PeerLostError, OperationTimeoutError: a rank is gone or too slow.
    """
    _submit(group, "gather_object", lambda g: g.gather_object(obj, object_gather_list, g.members.root(dst, group_dst, "dst", 0)), False)


def scatter_object_list(
    scatter_object_output_list: list,
    scatter_object_input_list: list | None = None,
    src: int | None = None,
    group: Group = None,
    group_src: int | None = None,
) -> None:
    """``src``'s ``scatter_object_input_list[rank]`` lands in ``scatter_object_output_list[0]``.

    Any thread but asyncdist's loop thread (there it raises WrongThreadError).

    Args:
        scatter_object_output_list: a list of at least one item; item 0 is replaced.
        scatter_object_input_list: on ``src``, one picklable object per group rank.
        src: the source's global rank (default 0; or give ``group_src``).
        group: the process group (default: the world).
        group_src: the source's rank within ``group``.

    Returns:
        None.

    Raises:
        InvalidArgumentError: an empty output list, or a wrong input list on ``src``.
        InvalidRankError: ``src`` is not in ``group``.
        PeerLostError, OperationTimeoutError: a rank is gone or too slow.
    """
    _submit(
        group,
        "scatter_object_list",
        lambda g: g.scatter_object_list(
            scatter_object_output_list, scatter_object_input_list, g.members.root(src, group_src, "src", 0)
        ),
        False,
    )


def send_object_list(
    object_list: list,
    dst: int | None = None,
    group: Group = None,
    device: Any = None,
    group_dst: int | None = None,
    use_batch: bool = False,
) -> None:
    """Send the picklable objects of ``object_list`` to ``dst`` (point to point).

    Any thread but asyncdist's loop thread (there it raises WrongThreadError).

    ``dst`` receives them with :func:`recv_object_list` into a list of the same length.

    Args:
        object_list: the objects.
        dst: the destination's global rank (or give ``group_dst``).
        group: the process group (default: the world).
        device, use_batch: accepted for torch compatibility; unused.
        group_dst: the destination's rank within ``group``.

    Returns:
        None.

    Raises:
        InvalidRankError: ``dst`` is missing, not in ``group``, or this rank.
        PeerLostError, OperationTimeoutError: as for ``send``.
    """
    _submit(group, "send_object_list", lambda g: g.send_object_list(object_list, g.members.root(dst, group_dst, "dst")), False)


def recv_object_list(
    object_list: list,
    src: int | None = None,
    group: Group = None,
    device: Any = None,
    group_src: int | None = None,
    use_batch: bool = False,
) -> int:
    """Receive objects sent with :func:`send_object_list` into ``object_list`` (in place).

    Any thread but asyncdist's loop thread (there it raises WrongThreadError).

    Args:
        object_list: a list as long as the sender's; its items are replaced.
        src: the sender's global rank (or give ``group_src``). Unlike torch,
            None for both receives from any rank.
        group: the process group (default: the world).
        device, use_batch: accepted for torch compatibility; unused.
        group_src: the sender's rank within ``group``.

    Returns:
        The sender's global rank (-1 if this rank is not in ``group``).

    Raises:
        BufferMismatchError: the sender's list has another length.
        PeerLostError, OperationTimeoutError: as for ``recv``.
    """
    async def received(g: ProcessGroup) -> int:
        sender = await g.recv_object_list(object_list, g.members.named(src, group_src, "src"))
        return g.ranks[sender]

    sender = _submit(group, "recv_object_list", received, False)
    return -1 if sender is None else sender

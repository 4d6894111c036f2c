"""The blocking facade's collectives: torch.distributed's signatures over the await API.

Each function here is a shell over the :class:`~asyncdist.group.process_group.ProcessGroup`
method of the same name: :func:`_submit` runs the method's coroutine on the
loop thread as a Task, wraps it in a :class:`~asyncdist.group.work.Work`, and
returns the Work (``async_op=True``) or waits for it and returns None. The
checks, algorithms and error messages all live below, in the await API.

This module owns :func:`_submit`, which the facade's other group calls share
(the reductions in :mod:`asyncdist.facade.reductions`, the object collectives
in :mod:`asyncdist.facade.objects`), and the collectives that move data
without combining it (broadcast, the gathers, scatter, all_to_all); the
barriers are :mod:`asyncdist.facade.barriers`'. It knows nothing of reduction ops: the collectives that take an
``op=`` are :mod:`asyncdist.facade.reductions`'.

torch's rules, kept here and in :mod:`asyncdist.facade.reductions`:

* a rank that is not in ``group`` (including ``GroupMember.NON_GROUP_MEMBER``)
  returns None at once and touches nothing;
* ``src``/``dst`` are global ranks, ``group_src``/``group_dst`` ranks within
  ``group`` (give one, not both); ``gather`` and ``scatter`` default to global
  rank 0, ``broadcast`` and ``reduce`` need one of the two;
* every rank of the group calls the same collectives in the same order.

Thread affinity: any thread but asyncdist's loop thread (a call there raises
:class:`~asyncdist.errors.WrongThreadError` instead of deadlocking).
"""

from __future__ import annotations

from typing import Any, Callable, Coroutine, Sequence

from .._profiling import profiled
from .lifecycle import Group, _member_and_portal
from ..group.process_group import ProcessGroup
from ..group.work import Work

__all__ = [
    "broadcast",
    "all_gather",
    "all_gather_coalesced",
    "all_gather_into_tensor",
    "all_gather_single",
    "gather",
    "scatter",
    "all_to_all",
    "all_to_all_single",
]

def _submit(
    group: Group,
    what: str,
    operation: Callable[[ProcessGroup], Coroutine[Any, Any, Any]],
    async_op: bool,
    outputs: Sequence[Any] = (),
    inputs: Sequence[Any] | None = None,
) -> Any:
    """Run ``operation(g)`` on the loop thread as a Task of ``group`` (resolved to ``g``);
    a profiler event records the shapes of ``inputs`` (default ``outputs``), as gloo's do.

    Returns:
        None if this rank is not in the group; else the Work if ``async_op``,
        else the operation's value once it has completed.
    """
    g, portal = _member_and_portal(group)
    if g is None:
        return None
    shapes = outputs if inputs is None else inputs
    if not async_op:  # one round trip to the loop thread: start, run and wait together
        return profiled(what, shapes, portal.run, operation(g), what=f"{what}()")

    def start() -> Work:
        # operation(g) runs on the loop thread: argument errors raise here, at once.
        # Work.start records the calls it opens, for a timed-out wait's message.
        return Work.start(lambda: operation(g), f"{what} on group {g.name!r}", list(outputs), rank=g.global_rank(g.rank))

    return profiled(what, shapes, portal.start, start, what=f"{what}()")


def broadcast(
    tensor: Any, src: int | None = None, group: Group = None, async_op: bool = False, group_src: int | None = None
) -> Work | None:
    """Copy ``src``'s ``tensor`` into ``tensor`` on every rank of ``group`` (in place).

    Any thread but asyncdist's loop thread (there it raises WrongThreadError).

    Args:
        tensor: a torch CPU tensor or NumPy array with the same dtype and
            element count on every rank; the data on ``src``, the output elsewhere.
        src: the source's global rank (or give ``group_src``).
        group: the process group (default: the world).
        async_op: return a Work instead of waiting.
        group_src: the source's rank within ``group``.

    Returns:
        A Work if ``async_op``, else None (also None if this rank is not in ``group``).

    Raises:
        InvalidArgumentError: neither or both of ``src`` and ``group_src``.
        InvalidRankError: ``src`` is not in ``group``.
        CollectiveMismatchError: ranks disagree on the root, dtype or size.
        PeerLostError: a rank of the group is gone.
        OperationTimeoutError: not complete within the group's timeout.

    Example::

        t = torch.arange(4.0) if dist.get_rank() == 0 else torch.empty(4)
        dist.broadcast(t, src=0)
    """
    return _submit(group, "broadcast", lambda g: g.broadcast(tensor, g.members.root(src, group_src, "src")), async_op, [tensor])


def all_gather(tensor_list: list, tensor: Any, group: Group = None, async_op: bool = False) -> Work | None:
    """Every rank's ``tensor`` lands in ``tensor_list[rank]`` on every rank.

    Any thread but asyncdist's loop thread (there it raises WrongThreadError).

    Args:
        tensor_list: one output tensor per group rank, each like ``tensor``.
        tensor: this rank's input.
        group: the process group (default: the world).
        async_op: return a Work instead of waiting.

    Returns:
        A Work if ``async_op``, else None (also None if this rank is not in ``group``).

    Raises:
        InvalidArgumentError: ``tensor_list`` has the wrong length, dtype or sizes.
        CollectiveMismatchError, PeerLostError, OperationTimeoutError: as for :func:`broadcast`.
    """
    return _submit(group, "all_gather", lambda g: g.all_gather(tensor_list, tensor), async_op, tensor_list, [tensor])


def all_gather_coalesced(
    output_tensor_lists: list, input_tensor_list: list, group: Group = None, async_op: bool = False
) -> Work | None:
    """Gather each of several tensors from every rank (torch's deprecated ``all_gather_coalesced``).

    Any thread but asyncdist's loop thread. ``output_tensor_lists[r][i]``
    receives rank ``r``'s ``input_tensor_list[i]``: one :func:`all_gather`
    per input, in order.

    Returns:
        A Work if ``async_op``, else None (also None if this rank is not in ``group``).
    """
    rows = [list(row) for row in output_tensor_lists]
    inputs = list(input_tensor_list)

    async def gather_each(g: ProcessGroup) -> None:
        for i, tensor in enumerate(inputs):
            await g.all_gather([row[i] for row in rows], tensor)

    return _submit(group, "all_gather_coalesced", gather_each, async_op, [t for row in rows for t in row], inputs)


def all_gather_into_tensor(output_tensor: Any, input_tensor: Any, group: Group = None, async_op: bool = False) -> Work | None:
    """Concatenate every rank's ``input_tensor``, in rank order, into ``output_tensor``.

    Any thread but asyncdist's loop thread (there it raises WrongThreadError).

    Args:
        output_tensor: ``world size`` times the elements of ``input_tensor``
            (concatenated along dim 0, or stacked).
        input_tensor: this rank's input; same size on every rank.
        group: the process group (default: the world).
        async_op: return a Work instead of waiting.

    Returns:
        A Work if ``async_op``, else None (also None if this rank is not in ``group``).

    Raises:
        InvalidArgumentError: ``output_tensor`` has the wrong dtype or size.
        CollectiveMismatchError, PeerLostError, OperationTimeoutError: as for :func:`broadcast`.
    """
    return _all_gather_into_tensor("all_gather_into_tensor", output_tensor, input_tensor, group, async_op)


def all_gather_single(output_tensor: Any, input_tensor: Any, group: Group = None, async_op: bool = False) -> Work | None:
    """torch 2.13's name for :func:`all_gather_into_tensor`; same arguments, same result.

    Any thread but asyncdist's loop thread (there it raises WrongThreadError).
    """
    return _all_gather_into_tensor("all_gather_single", output_tensor, input_tensor, group, async_op)


def _all_gather_into_tensor(what: str, output_tensor: Any, input_tensor: Any, group: Group, async_op: bool) -> Work | None:
    return _submit(group, what, lambda g: g.all_gather_into_tensor(output_tensor, input_tensor), async_op, [output_tensor],
                   [input_tensor])


def gather(
    tensor: Any,
    gather_list: list | None = None,
    dst: int | None = None,
    group: Group = None,
    async_op: bool = False,
    group_dst: int | None = None,
) -> Work | None:
    """Every rank's ``tensor`` lands in ``gather_list[rank]`` on ``dst``.

    Any thread but asyncdist's loop thread (there it raises WrongThreadError).

    Args:
        tensor: this rank's input.
        gather_list: on ``dst``, one output per group rank; elsewhere None or empty.
        dst: the destination's global rank (default 0; or give ``group_dst``).
        group: the process group (default: the world).
        async_op: return a Work instead of waiting.
        group_dst: the destination's rank within ``group``.

    Returns:
        A Work if ``async_op``, else None (also None if this rank is not in ``group``).

    Raises:
        InvalidArgumentError: ``gather_list`` is wrong for this rank; both ``dst`` and ``group_dst``.
        InvalidRankError: ``dst`` is not in ``group``.
        CollectiveMismatchError, PeerLostError, OperationTimeoutError: as for :func:`broadcast`.
    """
    return _submit(
        group, "gather", lambda g: g.gather(tensor, gather_list, g.members.root(dst, group_dst, "dst", 0)), async_op, gather_list or [],
        [tensor],
    )


def scatter(
    tensor: Any,
    scatter_list: list | None = None,
    src: int | None = None,
    group: Group = None,
    async_op: bool = False,
    group_src: int | None = None,
) -> Work | None:
    """``src``'s ``scatter_list[rank]`` lands in ``tensor`` on every rank.

    Any thread but asyncdist's loop thread (there it raises WrongThreadError).

    Args:
        tensor: this rank's output.
        scatter_list: on ``src``, one input per group rank; elsewhere None or empty.
        src: the source's global rank (default 0; or give ``group_src``).
        group: the process group (default: the world).
        async_op: return a Work instead of waiting.
        group_src: the source's rank within ``group``.

    Returns:
        A Work if ``async_op``, else None (also None if this rank is not in ``group``).

    Raises:
        InvalidArgumentError: ``scatter_list`` is wrong for this rank; both ``src`` and ``group_src``.
        InvalidRankError: ``src`` is not in ``group``.
        CollectiveMismatchError, PeerLostError, OperationTimeoutError: as for :func:`broadcast`.
    """
    return _submit(
        group, "scatter", lambda g: g.scatter(tensor, scatter_list, g.members.root(src, group_src, "src", 0)), async_op, [tensor],
        scatter_list or [],
    )


def all_to_all(output_tensor_list: list, input_tensor_list: list, group: Group = None, async_op: bool = False) -> Work | None:
    """Rank i's ``input_tensor_list[j]`` lands in rank j's ``output_tensor_list[i]``.

    Any thread but asyncdist's loop thread (there it raises WrongThreadError).

    Args:
        output_tensor_list: one output per group rank (sizes may differ).
        input_tensor_list: one input per group rank; one dtype throughout.
        group: the process group (default: the world).
        async_op: return a Work instead of waiting.

    Returns:
        A Work if ``async_op``, else None (also None if this rank is not in ``group``).

    Raises:
        InvalidArgumentError: wrong list lengths or mixed dtypes.
        BufferMismatchError: an output's size differs from what its sender sends.
        PeerLostError, OperationTimeoutError: as for :func:`broadcast`.
    """
    return _submit(
        group, "all_to_all", lambda g: g.all_to_all(output_tensor_list, input_tensor_list), async_op, output_tensor_list,
        input_tensor_list,
    )


def all_to_all_single(
    output: Any,
    input: Any,
    output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None,
    group: Group = None,
    async_op: bool = False,
) -> Work | None:
    """Split ``input`` by dim-0 rows and send part j to rank j; rank i's part lands
    in ``output`` at slot i.

    Any thread but asyncdist's loop thread (there it raises WrongThreadError).

    Args:
        output: contiguous output; its rows are split by ``output_split_sizes``.
        input: contiguous input; its rows are split by ``input_split_sizes``.
        output_split_sizes, input_split_sizes: rows per group rank; None or
            empty splits evenly.
        group: the process group (default: the world).
        async_op: return a Work instead of waiting.

    Returns:
        A Work if ``async_op``, else None (also None if this rank is not in ``group``).

    Raises:
        InvalidArgumentError: split sizes that do not add up; dtypes differ.
        UnsupportedBufferError: a non-contiguous tensor (torch refuses them too).
        BufferMismatchError, PeerLostError, OperationTimeoutError: as for :func:`all_to_all`.
    """
    return _submit(
        group,
        "all_to_all_single",
        lambda g: g.all_to_all_single(output, input, output_split_sizes, input_split_sizes),
        async_op,
        [output],
        [input],
    )

"""The blocking facade's reductions: the collectives that take an ``op=``.

all_reduce, all_reduce_coalesced, reduce and the three reduce_scatter forms,
with torch.distributed's signatures over the await API. Each is a shell over
the :class:`~asyncdist.group.process_group.ProcessGroup` method of the same name,
submitted through :func:`asyncdist.facade.collectives._submit` exactly as the
other collectives are; torch's rules (non-members return None at once,
``dst``/``group_dst``, one call order on every rank) are stated, and kept, in
:mod:`asyncdist.facade.collectives`.

This module knows the default op (``ReduceOp.SUM``) and passes ``op`` through
untouched: which op applies to which dtype, and the check, the kernels and the
error messages, live below it in :mod:`asyncdist.reduce.op`,
:mod:`asyncdist.reduce.kernels` and the await API. It knows nothing of the loop thread or
of Work beyond what ``_submit`` returns.

Thread affinity: any thread but asyncdist's loop thread (a call there raises
:class:`~asyncdist.errors.WrongThreadError` instead of deadlocking).
"""

from __future__ import annotations

from typing import Any, Sequence

from .collectives import _submit
from .lifecycle import Group
from ..reduce.op import ReduceOp, RedOpType, op_type
from ..group.work import Work

__all__ = [
    "all_reduce",
    "all_reduce_coalesced",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "supports_complex",
]


def all_reduce(tensor: Any, op: Any = ReduceOp.SUM, group: Group = None, async_op: bool = False) -> Work | None:
    """Combine ``tensor`` of every rank with ``op``; every rank gets the result in place.

    Any thread but asyncdist's loop thread (there it raises WrongThreadError).

    Args:
        tensor: a torch CPU tensor or NumPy array, same dtype and size on every rank.
        op: a ``ReduceOp`` (SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR) or
            the result of ``make_premul_sum``.
        group: the process group (default: the world).
        async_op: return a Work instead of waiting.

    Returns:
        A Work if ``async_op``, else None (also None if this rank is not in ``group``).

    Raises:
        InvalidArgumentError: ``op`` does not apply to the dtype (e.g. AVG on integers).
        CollectiveMismatchError: ranks disagree on the op, dtype or size.
        PeerLostError, OperationTimeoutError: as for :func:`broadcast`.

    Example::

        t = torch.ones(3) * (dist.get_rank() + 1)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)   # 1 + 2 + ... + world size
    """
    return _submit(group, "all_reduce", lambda g: g.all_reduce(tensor, op), async_op, [tensor])


def all_reduce_coalesced(tensors: Sequence[Any], op: Any = ReduceOp.SUM, group: Group = None, async_op: bool = False) -> Work | None:
    """All-reduce each tensor of ``tensors`` in place, as one call.

    Any thread but asyncdist's loop thread (there it raises WrongThreadError).

    Args:
        tensors: tensors or arrays; the list must match on every rank.
        op, group, async_op: as for :func:`all_reduce`.

    Returns:
        A Work if ``async_op``, else None (also None if this rank is not in ``group``).

    Raises:
        As :func:`all_reduce`.
    """
    tensors = list(tensors)
    return _submit(group, "all_reduce_coalesced", lambda g: g.all_reduce_coalesced(tensors, op), async_op, tensors)


def reduce(
    tensor: Any,
    dst: int | None = None,
    op: Any = ReduceOp.SUM,
    group: Group = None,
    async_op: bool = False,
    group_dst: int | None = None,
) -> Work | None:
    """Combine ``tensor`` of every rank with ``op`` into ``dst``'s ``tensor`` (others unchanged).

    Any thread but asyncdist's loop thread (there it raises WrongThreadError).

    Args:
        tensor: the input everywhere, the output on ``dst``.
        dst: the destination's global rank (or give ``group_dst``).
        op: as for :func:`all_reduce`.
        group: the process group (default: the world).
        async_op: return a Work instead of waiting.
        group_dst: the destination's rank within ``group``.

    Returns:
        A Work if ``async_op``, else None (also None if this rank is not in ``group``).

    Raises:
        InvalidArgumentError: neither or both of ``dst`` and ``group_dst``; a bad ``op``.
        InvalidRankError: ``dst`` is not in ``group``.
        CollectiveMismatchError, PeerLostError, OperationTimeoutError: as for :func:`all_reduce`.
    """
    return _submit(group, "reduce", lambda g: g.reduce(tensor, g.members.root(dst, group_dst, "dst"), op), async_op, [tensor])


def reduce_scatter(output: Any, input_list: list, op: Any = ReduceOp.SUM, group: Group = None, async_op: bool = False) -> Work | None:
    """Combine every rank's ``input_list[i]`` with ``op`` into ``output`` of group rank i.

    Any thread but asyncdist's loop thread (there it raises WrongThreadError).

    Args:
        output: this rank's result; like each ``input_list`` item.
        input_list: one input per group rank.
        op: as for :func:`all_reduce`.
        group: the process group (default: the world).
        async_op: return a Work instead of waiting.

    Returns:
        A Work if ``async_op``, else None (also None if this rank is not in ``group``).

    Raises:
        InvalidArgumentError: wrong list length, dtypes or sizes; a bad ``op``.
        CollectiveMismatchError, PeerLostError, OperationTimeoutError: as for :func:`all_reduce`.
    """
    return _submit(group, "reduce_scatter", lambda g: g.reduce_scatter(output, input_list, op), async_op, [output], input_list)


def reduce_scatter_tensor(output: Any, input: Any, op: Any = ReduceOp.SUM, group: Group = None, async_op: bool = False) -> Work | None:
    """Combine every rank's ``input`` with ``op``; group rank i gets its i-th slice in ``output``.

    Any thread but asyncdist's loop thread (there it raises WrongThreadError).

    Args:
        output: this rank's result.
        input: ``world size`` times the elements of ``output`` (concatenated or stacked).
        op: as for :func:`all_reduce`.
        group: the process group (default: the world).
        async_op: return a Work instead of waiting.

    Returns:
        A Work if ``async_op``, else None (also None if this rank is not in ``group``).

    Raises:
        InvalidArgumentError: ``input`` has the wrong dtype or size; a bad ``op``.
        CollectiveMismatchError, PeerLostError, OperationTimeoutError: as for :func:`all_reduce`.
    """
    return _reduce_scatter_tensor("reduce_scatter_tensor", output, input, op, group, async_op)


def reduce_scatter_single(output: Any, input: Any, op: Any = ReduceOp.SUM, group: Group = None, async_op: bool = False) -> Work | None:
    """torch 2.13's name for :func:`reduce_scatter_tensor`; same arguments, same result.

    Any thread but asyncdist's loop thread (there it raises WrongThreadError).
    """
    return _reduce_scatter_tensor("reduce_scatter_single", output, input, op, group, async_op)


def _reduce_scatter_tensor(what: str, output: Any, input: Any, op: Any, group: Group, async_op: bool) -> Work | None:
    return _submit(group, what, lambda g: g.reduce_scatter_tensor(output, input, op), async_op, [output], [input])


#: The ops asyncdist refuses on complex tensors: complex numbers are not ordered,
#: and have no bits to combine. (torch refuses PRODUCT too; asyncdist computes it.)
_NOT_FOR_COMPLEX = frozenset({RedOpType.MIN, RedOpType.MAX, RedOpType.BAND, RedOpType.BOR, RedOpType.BXOR})


def supports_complex(reduceOp: Any) -> bool:  # noqa: N803 (torch's name)
    """Whether the reductions accept complex tensors with ``reduceOp``.

    Any thread. Unlike torch, True for PRODUCT, which asyncdist computes as a
    complex product (see :mod:`asyncdist.reduce.op`).
    """
    return op_type(reduceOp) not in _NOT_FOR_COMPLEX


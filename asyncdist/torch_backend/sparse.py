"""all_reduce of a sparse COO tensor, summed as gloo sums it.

gloo's ``ProcessGroupGloo::allreduce`` takes sparse COO tensors with
``ReduceOp.SUM``: each rank coalesces its tensor, every rank gathers every
rank's indices and values, concatenates them in rank order and coalesces the
whole, which sums the values of equal indices; the result replaces the
tensor's contents in place (the same tensor object, its indices and values
now the sum's, coalesced), and the Work's ``result()`` is that tensor. This
module does the same over three of the group's collective calls:

1. ``all_gather_into_tensor`` of each rank's ``[nnz, *size]`` (int64), so that
   every rank knows every rank's count and can check that the sizes agree;
2. ``all_gather_into_tensor`` of the indices, one row per element, each
   rank's padded to the largest count (at least one row);
3. the same for the values.

The three numbers are reserved when the operation first runs
(:meth:`~asyncdist.group.process_group.ProcessGroup.reserve_calls`), so that
an operation started on the same group meanwhile cannot take a number
between them: every rank numbers its calls alike, whatever the timing. The
calls' descriptions carry dtype and shape, so a rank whose sparse or dense
dimensions or dtype differ gets asyncdist's CollectiveMismatchError from the
gather itself.

Floating-point sums are bitwise gloo's: the same coalesce of the same
concatenation in the same order.

Loop thread only (a coroutine of the group's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Coroutine

import torch

from ..errors import CollectiveMismatchError, InvalidArgumentError
from ..reduce.op import op_name

if TYPE_CHECKING:
    from ..group.process_group import ProcessGroup

__all__ = ["all_reduce_sparse"]


def all_reduce_sparse(group: ProcessGroup, tensor: torch.Tensor, op: Any) -> Coroutine[Any, Any, None]:
    """The coroutine that sums the sparse COO ``tensor`` over ``group``, in place.

    Args:
        group: the asyncdist group (its ranks all call this, in the same order
            of the group's collectives).
        tensor: a sparse COO tensor on the CPU, of the same size on every rank.
        op: the reduction; only SUM, as with gloo.

    Raises:
        InvalidArgumentError: ``op`` is not SUM, or ``tensor`` is not on the
            CPU (at once, before anything is sent).
        CollectiveMismatchError: from the coroutine, when the ranks' sizes,
            dimensions or dtypes differ.
    """
    name = op_name(op)
    if name != "sum":
        raise InvalidArgumentError(
            f"rank {group.rank} of group {group.name!r}: all_reduce of sparse tensors takes only ReduceOp.SUM "
            f"(as gloo's), got {name}")
    if tensor.device.type != "cpu":
        raise InvalidArgumentError(
            f"rank {group.rank} of group {group.name!r}: all_reduce of sparse tensors serves CPU tensors, "
            f"got one on {tensor.device}")

    async def summed() -> None:
        # Numbered as the operation first runs, as every collective is: see the module docstring.
        reservation = group.reserve_calls(3)
        try:
            with reservation.active():
                total = await _gathered_sum(group, tensor.coalesce())
        except BaseException as exc:
            reservation.abandon(exc)
            raise
        tensor.copy_(total)

    return summed()


async def _gathered_sum(group: ProcessGroup, local: torch.Tensor) -> torch.Tensor:
    """Every rank's coalesced ``local`` concatenated in rank order, coalesced (three calls)."""
    size, n = list(local.shape), group.size
    mine = torch.tensor([local._nnz(), *size], dtype=torch.int64)
    metas = torch.empty(n * mine.numel(), dtype=torch.int64)
    await group.all_gather_into_tensor(metas, mine)
    metas = metas.view(n, -1)
    for rank, meta in enumerate(metas.tolist()):
        if meta[1:] != size:
            raise CollectiveMismatchError(
                f"rank {group.rank} of group {group.name!r}: all_reduce of a sparse tensor of size "
                f"{tuple(size)}, but rank {rank}'s is {tuple(meta[1:])}")
    counts = metas[:, 0].tolist()
    rows = max(1, *counts)
    indices = await _gathered_rows(group, local._indices().t(), rows)
    values = await _gathered_rows(group, local._values(), rows)
    keep = torch.cat([torch.arange(rank * rows, rank * rows + count) for rank, count in enumerate(counts)])
    # Every index is a valid one of a rank whose size is ours (checked above): no checks needed.
    whole = torch.sparse_coo_tensor(indices[keep].t(), values[keep], size, dtype=local.dtype, check_invariants=False)
    return whole.coalesce()


async def _gathered_rows(group: ProcessGroup, rows: torch.Tensor, width: int) -> torch.Tensor:
    """Every rank's ``rows`` (one element per row), each padded to ``width`` rows, in rank order."""
    padded = rows.new_zeros((width, *rows.shape[1:]))
    padded[: rows.shape[0]] = rows
    out = rows.new_empty((group.size * width, *rows.shape[1:]))
    await group.all_gather_into_tensor(out, padded)
    return out

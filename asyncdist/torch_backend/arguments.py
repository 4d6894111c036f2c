"""torch.distributed's call arguments in asyncdist's terms.

torch calls a backend with a list of tensors and an ``*Options`` struct
(``reduceOp``, ``rootRank``, split sizes); these read what asyncdist's await
API takes out of them, for :mod:`.process_group`. Any thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence, TypeVar

import torch.distributed as tdist

from ..errors import InvalidArgumentError
from ..reduce.op import RedOpType, own_op

if TYPE_CHECKING:
    from torch._C._distributed_c10d import (
        AllreduceOptions,
        BroadcastOptions,
        GatherOptions,
        ReduceOptions,
        ReduceScatterOptions,
        ScatterOptions,
    )

__all__ = ["one", "splits", "op", "root"]

_T = TypeVar("_T")


def one(tensors: Sequence[_T], what: str) -> _T:
    """torch passes a list of one tensor per call (a list per device, once)."""
    if len(tensors) != 1:
        raise InvalidArgumentError(f"{what} takes one tensor per call on the asyncdist backend, got {len(tensors)}")
    return tensors[0]


def splits(sizes: Sequence[int]) -> list[int] | None:
    """torch's empty split list means "split evenly"; asyncdist's is None."""
    return list(sizes) if len(sizes) else None


def op(opts: AllreduceOptions | ReduceOptions | ReduceScatterOptions | None) -> Any:
    """The reduction of a torch ``*Options`` in asyncdist's terms (SUM when torch passed none)."""
    if opts is None:
        return RedOpType.SUM
    torch_op: Any = opts.reduceOp  # (torch's stubs have no .op)
    kind = _OWN_KINDS.get(int(torch_op.op))
    return kind if kind is not None else own_op(torch_op)  # PREMUL_SUM: its factor too


#: torch's plain reduction kinds by value, as asyncdist's: ``int()`` of torch's
#: pybind enum is one C call, where hashing it or reading its name is several.
_OWN_KINDS = {int(getattr(tdist.ReduceOp, kind.name)): kind for kind in RedOpType
              if kind is not RedOpType.PREMUL_SUM and hasattr(tdist.ReduceOp, kind.name)}


def root(opts: BroadcastOptions | ReduceOptions | GatherOptions | ScatterOptions | None) -> int:
    """The root (a group rank) of a torch ``*Options``."""
    return 0 if opts is None else opts.rootRank

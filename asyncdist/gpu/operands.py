"""Which arguments of each collective are read and which are written, on which rank.

A device operand is staged through host memory, and the staging must know,
per rank, whether to copy the device data to the host before the operation
(it is read) and back after (it is written): copying back a tensor that the
operation leaves alone would race with the user's own work on it, and
copying in an output the operation only writes would waste a transfer. The
rules are torch.distributed's semantics, written once here as data, so the
staging and the NCCL path (which needs the same argument names) share them.

Nothing here touches a device: it names arguments and answers questions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Operand", "Spec", "SPECS", "PIPELINED"]

Who = Literal["all", "root", "others", "none"]


@dataclass(frozen=True, slots=True)
class Operand:
    """One tensor argument (or list of tensors, ``many``) of a collective."""

    arg: str
    reads: Who
    writes: Who
    many: bool = False

    def read_on(self, rank: int, root: Any) -> bool:
        return _applies(self.reads, rank, root)

    def written_on(self, rank: int, root: Any) -> bool:
        return _applies(self.writes, rank, root)


def _applies(who: Who, rank: int, root: Any) -> bool:
    if who == "all":
        return True
    if who == "root":
        return rank == root
    if who == "others":
        return rank != root
    return False


@dataclass(frozen=True, slots=True)
class Spec:
    """A collective's operands, and the argument naming its root (if any)."""

    operands: tuple[Operand, ...]
    root: str | None = None

    def calls(self, arguments: dict[str, Any]) -> int:
        """How many collective calls (channels) the host method opens: one, or
        for a coalesced one, one per dtype of its tensors (:mod:`asyncdist.group.packing`)."""
        tensors = arguments.get("tensors", arguments.get("outputs"))
        if ("tensors" in arguments or "outputs" in arguments) and isinstance(tensors, (list, tuple)):
            return len({tensor.dtype for tensor in tensors})
        return 1


def _op(arg: str, reads: Who, writes: Who, many: bool = False) -> Operand:
    return Operand(arg, reads, writes, many)


SPECS: dict[str, Spec] = {
    "broadcast": Spec((_op("tensor", "root", "others"),), root="src"),
    "all_reduce": Spec((_op("tensor", "all", "all"),)),
    "all_reduce_coalesced": Spec((_op("tensors", "all", "all", many=True),)),
    "reduce": Spec((_op("tensor", "all", "root"),), root="dst"),
    "all_gather": Spec((_op("tensor_list", "none", "all", many=True), _op("tensor", "all", "none"))),
    "all_gather_into_tensor": Spec((_op("output_tensor", "none", "all"), _op("input_tensor", "all", "none"))),
    "gather": Spec((_op("tensor", "all", "none"), _op("gather_list", "none", "root", many=True)), root="dst"),
    "scatter": Spec((_op("tensor", "none", "all"), _op("scatter_list", "root", "none", many=True)), root="src"),
    "reduce_scatter": Spec((_op("output", "none", "all"), _op("input_list", "all", "none", many=True))),
    "reduce_scatter_tensor": Spec((_op("output", "none", "all"), _op("input", "all", "none"))),
    "all_gather_into_tensor_coalesced": Spec(
        (_op("outputs", "none", "all", many=True), _op("inputs", "all", "none", many=True))
    ),
    "reduce_scatter_tensor_coalesced": Spec(
        (_op("outputs", "none", "all", many=True), _op("inputs", "all", "none", many=True))
    ),
    "all_to_all": Spec(
        (_op("output_tensor_list", "none", "all", many=True), _op("input_tensor_list", "all", "none", many=True))
    ),
    "all_to_all_single": Spec((_op("output", "none", "all"), _op("input", "all", "none"))),
}
"""Collective method name -> its operands (await API names and arguments)."""

#: Element-wise collectives of one tensor: a large one may run as a pipeline of
#: calls on consecutive chunks, each chunk's copies overlapping the others' transfers.
PIPELINED = frozenset({"all_reduce", "broadcast", "reduce"})

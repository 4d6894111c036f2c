"""Reading an operation's description back into its parts, off the hot path.

The group layer describes each collective call in one string, the same one
its messages carry for the mismatch check: ``all_reduce(sum, float32[4])``,
``broadcast(src=1, float32[4, 2])``, ``barrier``. The flight recorder keeps
that string as it is; this module reads it when a record is shown (a hang
warning, a dump's analysis, a timeline), so that the engine stays ignorant
of which collectives exist and the hot path formats nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Described", "parse", "short"]

_CALL = re.compile(r"^(?P<op>[A-Za-z_][\w.]*)(?:\((?P<args>.*)\))?$")
_SIGNATURE = re.compile(r"^(?P<dtype>[a-z]\w*)\[(?P<shape>[\d, ]*)\]( per rank)?$")
_TOP_LEVEL_COMMA = re.compile(r",\s*(?![^\[]*\])")
_ITEMSIZE = {"bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1, "bool": 1}


@dataclass(frozen=True, slots=True)
class Described:
    """An operation's description, in parts (None where it does not say).

    Attributes:
        op: the operation's name ("all_reduce"); for a message, "send" or "recv".
        root: a rooted call's root (its ``src=`` or ``dst=``).
        reduce: a reduction's op ("sum").
        dtype, shape: the payload; nbytes: its size, where dtype and shape say it.
    """

    op: str
    root: int | None = None
    reduce: str | None = None
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    nbytes: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"op": self.op, "root": self.root, "reduce": self.reduce, "dtype": self.dtype,
                "shape": None if self.shape is None else list(self.shape), "nbytes": self.nbytes}


def itemsize(dtype: str) -> int | None:
    """Bytes per element of a dtype asyncdist names, or None if unknown."""
    if dtype in _ITEMSIZE:
        return _ITEMSIZE[dtype]
    try:
        return int(np.dtype(dtype).itemsize)
    except TypeError:
        return None


def parse(desc: str) -> Described:
    """The parts of ``desc`` ("reduce(dst=0, sum, float32[4])" -> reduce, root 0, sum, float32, (4,), 16)."""
    match = _CALL.match(desc.strip())
    if match is None:  # a message: "send to rank 1 (tag 7, group 'world')"
        return Described(desc.split(" ", 1)[0])
    root = reduce = dtype = None
    shape: tuple[int, ...] | None = None
    for arg in _TOP_LEVEL_COMMA.split(match.group("args") or ""):
        arg = arg.strip()
        signature = _SIGNATURE.match(arg)
        if signature is not None:
            dtype = signature.group("dtype")
            shape = tuple(int(d) for d in signature.group("shape").replace(" ", "").split(",") if d)
        elif arg.startswith(("src=", "dst=")) and arg[4:].isdigit():
            root = int(arg[4:])
        elif arg.isidentifier():
            if reduce is None and dtype is None and itemsize(arg) is None:
                reduce = arg
            else:
                dtype = arg  # all_to_all(float32): a dtype alone
    nbytes = None
    if dtype is not None and shape is not None:
        size = itemsize(dtype)
        nbytes = None if size is None else size * int(np.prod(shape, dtype=np.int64))
    return Described(match.group("op"), root, reduce, dtype, shape, nbytes)


def short(desc: str, seq: int, group: str, kind: str = "collective") -> str:
    """How a hang warning names an operation: "broadcast #56 (root 1) on group world"."""
    if kind != "collective":
        return desc
    parts = parse(desc)
    root = f" (root {parts.root})" if parts.root is not None else ""
    return f"{parts.op} #{seq}{root} on group {group}"

"""What an operation is, in parts: the :class:`Description` every operation carries.

The group layer describes each call it opens (op, root, reduce op, dtype,
shape; for a message, its peer, tag and group) and never formats or parses
a string for it: :func:`describe` and :func:`describe_message` make the
description, and its :attr:`~Description.text` is made once, with it. The
text is what the call's messages carry for the mismatch check
(``all_reduce(sum, float32[4])``, ``broadcast(src=1, float32[4, 2])``,
``barrier``, ``send to rank 1 (tag 7, group 'world')``) and what people
read; the parts are what the flight recorder, its dumps, the counters, the
hang warnings and ``asyncdist-trace`` read.

Both factories are cached: a loop of the same call gets the same object
back, so the hot path builds nothing and the flight recorder's ring finds
it identical to the previous operation's without comparing.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from ..buffers.host import signature

__all__ = ["Description", "describe", "describe_message", "itemsize", "short"]

_ITEMSIZE = {"bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1, "bool": 1}


def itemsize(dtype: str) -> int | None:
    """Bytes per element of a dtype asyncdist names, or None if unknown."""
    if dtype in _ITEMSIZE:
        return _ITEMSIZE[dtype]
    try:
        return int(np.dtype(dtype).itemsize)
    except TypeError:
        return None


@dataclass(frozen=True, slots=True)
class Description:
    """One operation, in parts (None where it has no such part).

    Attributes:
        op: the operation's name ("all_reduce"); for a message, "send" or "recv".
        root: a rooted call's root, as a group rank (its ``src=`` or ``dst=``).
        reduce: a reduction's op ("sum").
        dtype, shape: the payload (``shape`` per rank where ``per_rank``).
        per_rank: the shape is each rank's part (reduce_scatter's output).
        peer: a message's peer, as a group rank (None: any rank, or not a message).
        tag: a message's tag.
        group: a message's group name (a collective's group is its operation's).
        nbytes: the payload's size, where dtype and shape say it.
        text: the one-line form its messages carry and people read.
    """

    op: str
    root: int | None = None
    reduce: str | None = None
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    per_rank: bool = False
    peer: int | None = None
    tag: int | None = None
    group: str | None = None
    nbytes: int | None = field(default=None, compare=False)
    text: str = field(default="", compare=False)

    @property
    def is_message(self) -> bool:
        """Whether it describes one point-to-point message (a tag, no call number)."""
        return self.tag is not None

    def as_dict(self) -> dict[str, Any]:
        """The parts as JSON-able values (a dump's ``described``)."""
        return {"op": self.op, "root": self.root, "reduce": self.reduce, "dtype": self.dtype,
                "shape": None if self.shape is None else list(self.shape), "per_rank": self.per_rank,
                "peer": self.peer, "tag": self.tag, "group": self.group, "nbytes": self.nbytes}  # fmt: skip

    @classmethod
    def from_dict(cls, parts: Mapping[str, Any], text: str = "") -> Description:
        """The description :meth:`as_dict` gave (read back from a dump)."""
        shape = parts.get("shape")
        return cls(
            parts["op"], parts.get("root"), parts.get("reduce"), parts.get("dtype"),
            None if shape is None else tuple(shape), bool(parts.get("per_rank")), parts.get("peer"),
            parts.get("tag"), parts.get("group"), parts.get("nbytes"), text,
        )  # fmt: skip


@functools.lru_cache(maxsize=1024)  # every call describes itself; a loop of one call hits
def describe(
    op: str,
    *,
    root: int | None = None,
    reduce: str | None = None,
    dtype: str | None = None,
    shape: tuple[int, ...] | None = None,
    per_rank: bool = False,
) -> Description:
    """The description of a collective call.

    Example:
        >>> describe("reduce", root=0, reduce="sum", dtype="float32", shape=(4,)).text
        'reduce(dst=0, sum, float32[4])'
    """
    args = []
    if root is not None:
        args.append(f"{'src' if op in _FROM_ROOT else 'dst'}={root}")
    if reduce is not None:
        args.append(reduce)
    if dtype is not None:
        if shape is None:
            args.append(dtype)
        else:
            args.append(signature(dtype, shape) + (" per rank" if per_rank else ""))
    text = f"{op}({', '.join(args)})" if args else op
    nbytes = None
    if dtype is not None and shape is not None and (size := itemsize(dtype)) is not None:
        nbytes = size * int(np.prod(shape, dtype=np.int64))
    return Description(op, root, reduce, dtype, shape, per_rank, None, None, None, nbytes, text)


# The rooted calls whose root sends (src=); the others' root receives (dst=).
_FROM_ROOT = frozenset({"broadcast", "scatter"})


@functools.lru_cache(maxsize=1024)
def describe_message(op: str, peer: int | None, tag: int, group: str, nbytes: int | None = None) -> Description:
    """The description of one point-to-point message; ``peer`` None: from any rank.

    Example:
        >>> describe_message("send", 1, 7, "world").text
        "send to rank 1 (tag 7, group 'world')"
    """
    who = "any rank" if peer is None else f"rank {peer}"
    text = f"{op} {'to' if op == 'send' else 'from'} {who} (tag {tag}, group {group!r})"
    return Description(op, None, None, None, None, False, peer, tag, group, nbytes, text)


def short(described: Description, seq: int, group: str) -> str:
    """How a hang warning names an operation: "broadcast #56 (root 1) on group world"."""
    if described.is_message:
        return described.text
    root = f" (root {described.root})" if described.root is not None else ""
    return f"{described.op} #{seq}{root} on group {group}"

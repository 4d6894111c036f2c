"""Several tensors as one buffer: how the coalesced collectives make one call of many.

A coalesced call (``all_reduce_coalesced``, ``all_gather_into_tensor_coalesced``,
``reduce_scatter_tensor_coalesced``) packs its tensors of one dtype into one
scratch buffer, end to end in the order given, runs one collective on it,
and unpacks the result: one call number, one message per step of the
algorithm, whatever the number of tensors. Tensors of several dtypes make
one call per dtype, in the order each dtype first appears.

The call's description names the packed buffer and the number of tensors,
with a checksum of their sizes: ranks that pass the same total but split it
differently fail with :class:`~asyncdist.errors.CollectiveMismatchError`
instead of mixing one tensor's elements into another's.
"""

from __future__ import annotations

import itertools
import zlib
from dataclasses import replace
from typing import Sequence

from ..buffers.host import HostBuffer
from ..collectives.direct import copy_into
from ..flight.descriptions import Description, describe

__all__ = ["by_dtype", "offsets", "pack", "unpack", "describe_packed"]


def by_dtype(buffers: Sequence[HostBuffer]) -> list[list[int]]:
    """The indices of ``buffers``, grouped by dtype, each group in the given
    order and the groups in the order their dtype first appears."""
    groups: dict[str, list[int]] = {}
    for index, buf in enumerate(buffers):
        groups.setdefault(buf.dtype, []).append(index)
    return list(groups.values())


def offsets(sizes: Sequence[int]) -> list[int]:
    """Where each of consecutive pieces of ``sizes`` elements starts; one more: the total."""
    return list(itertools.accumulate(sizes, initial=0))


def pack(into: HostBuffer, pieces: Sequence[HostBuffer], starts: Sequence[int]) -> None:
    """Copy each of ``pieces`` into ``into`` at its element offset in ``starts``."""
    for piece, start in zip(pieces, starts):
        copy_into(into.elements(start, start + piece.numel), piece)


def unpack(packed: HostBuffer, pieces: Sequence[HostBuffer], starts: Sequence[int]) -> None:
    """The reverse of :func:`pack`: each of ``pieces`` from ``packed`` at its offset."""
    for piece, start in zip(pieces, starts):
        copy_into(piece, packed.elements(start, start + piece.numel))


def describe_packed(op: str, dtype: str, sizes: Sequence[int], *, reduce: str | None = None,
                    per_rank: bool = False) -> Description:
    """The description of a coalesced call on tensors of ``sizes`` elements,
    e.g. ``all_reduce_coalesced(sum, float32[10] as 3 tensors, sizes 5c4e2b1a)``."""
    described = describe(op, reduce=reduce, dtype=dtype, shape=(sum(sizes),), per_rank=per_rank)
    checksum = zlib.crc32(",".join(map(str, sizes)).encode())
    tensors = f"{len(sizes)} tensor{'' if len(sizes) == 1 else 's'}"
    return replace(described, text=f"{described.text[:-1]} as {tensors}, sizes {checksum:08x})")

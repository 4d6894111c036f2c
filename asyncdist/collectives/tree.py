"""Binomial trees rooted anywhere: broadcast and reduce in ceil(log2 n) rounds.

Ranks are renumbered relative to the root (``(rank - root) % n``), so one
tree shape serves every root. In the broadcast a rank receives from the
parent that differs in its lowest set bit, then sends to its children in
decreasing subtree size; the reduce runs the same tree backwards, combining
each child's partial result on the way up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..reduce import kernels as ops
from ..buffers.host import HostBuffer
from ..buffers.scratch import pool

if TYPE_CHECKING:
    from .channel import Channel, Recv

__all__ = ["binomial_broadcast", "binomial_reduce"]


def _parent_and_children(relative: int, n: int) -> tuple[int | None, list[int]]:
    """The relative ranks of a node's parent (None for the root) and children."""
    mask = 1
    while mask < n:
        if relative & mask:
            parent = relative - mask
            break
        mask <<= 1
    else:
        parent = None
    children = []
    mask >>= 1
    while mask > 0:
        if relative + mask < n:
            children.append(relative + mask)
        mask >>= 1
    return parent, children


async def binomial_broadcast(channel: Channel[Recv], buf: HostBuffer, root: int) -> None:
    """Copy the root's ``buf`` into every rank's ``buf``."""
    n, rank = channel.size, channel.rank
    parent, children = _parent_and_children((rank - root) % n, n)
    if parent is not None:
        await channel.recv(buf, (parent + root) % n)
    sends = [(channel.start_send(buf, (child + root) % n), (child + root) % n) for child in children]
    for future, peer in sends:
        await channel.wait_send(future, peer)


async def binomial_reduce(channel: Channel[Recv], buf: HostBuffer, root: int, op: object) -> None:
    """Combine every rank's ``buf`` into the root's ``buf``.

    Ranks other than the root use ``buf`` as their accumulator: the caller
    passes a copy where the input must survive.
    """
    n, rank = channel.size, channel.rank
    parent, children = _parent_and_children((rank - root) % n, n)
    if children:
        incoming = pool.take(buf.dtype, buf.numel)
        for child in reversed(children):  # smallest subtree first: it finishes first
            await channel.recv(incoming, (child + root) % n)
            ops.combine(op, buf, incoming)
        pool.give_back(incoming)
    if parent is not None:
        await channel.send(buf, (parent + root) % n)

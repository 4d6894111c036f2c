"""Which algorithm runs a collective call, by message size and group size.

Small messages are latency-bound: the algorithms with the fewest rounds win
(recursive doubling, binomial trees). Large messages are bandwidth-bound:
the ring algorithms move ``2(n-1)/n`` of the data per rank instead of
``log2 n`` times all of it. Every rank of a call computes the same choice
from the same arguments, which is what keeps their messages matched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Awaitable

from ..buffers.host import HostBuffer
from .doubling import recursive_doubling_all_reduce
from .ring import ring_all_reduce, ring_reduce, scatter_ring_broadcast
from .tree import binomial_broadcast, binomial_reduce

if TYPE_CHECKING:
    from .channel import Channel, Recv

__all__ = ["all_reduce", "broadcast", "reduce", "SMALL_MESSAGE_BYTES", "SCATTER_BROADCAST_MIN_RANKS"]

# Below this, a call is latency-bound on loopback and on a LAN alike: one
# extra round costs more than moving the data log2(n) times.
SMALL_MESSAGE_BYTES = 64 * 1024

# A large broadcast is scattered and ring-gathered only from this many ranks
# (MPICH's MPIR_CVAR_BCAST_MIN_PROCS has the same default). With fewer, a
# binomial tree's few rounds win even for large messages; and where ranks
# read each other's memory, each rank copies the message once either way.
SCATTER_BROADCAST_MIN_RANKS = 8


def all_reduce(channel: Channel[Recv], buf: HostBuffer, op: object) -> Awaitable[None]:
    """All-reduce ``buf`` in place."""
    if buf.nbytes < SMALL_MESSAGE_BYTES or buf.numel < channel.size:
        return recursive_doubling_all_reduce(channel, buf, op)
    return ring_all_reduce(channel, buf, op)


def broadcast(channel: Channel[Recv], buf: HostBuffer, root: int) -> Awaitable[None]:
    """Broadcast the root's ``buf``."""
    if buf.nbytes < SMALL_MESSAGE_BYTES or channel.size < SCATTER_BROADCAST_MIN_RANKS:
        return binomial_broadcast(channel, buf, root)
    return scatter_ring_broadcast(channel, buf, root)


def reduce(channel: Channel[Recv], buf: HostBuffer, root: int, op: object) -> Awaitable[None]:
    """Reduce every rank's ``buf`` (an accumulator) into the root's."""
    if buf.nbytes < SMALL_MESSAGE_BYTES or channel.size <= 2:
        return binomial_reduce(channel, buf, root, op)
    return ring_reduce(channel, buf, root, op)



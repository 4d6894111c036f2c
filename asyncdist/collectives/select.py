"""Which algorithm runs a collective call, by message size and group size.

Small messages are latency-bound: the algorithms with the fewest rounds win
(recursive doubling, binomial trees). Large messages are bandwidth-bound:
the ring algorithms move ``2(n-1)/n`` of the data per rank instead of
``log2 n`` times all of it. In between, on many ranks, the number of
messages counts as much as the bytes: Rabenseifner's halving and doubling
moves the ring's bytes in ``2 log2 n`` messages instead of ``2(n-1)``, and a
pipelined chain broadcasts sending the message once per rank. Every rank of a call computes the same choice
from the same arguments, which is what keeps their messages matched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Awaitable

from ..buffers.host import HostBuffer
from .chain import chain_broadcast
from .doubling import recursive_doubling_all_reduce
from .halving import halving_doubling_all_reduce
from .ring import ring_all_reduce, ring_reduce
from .tree import binomial_broadcast, binomial_reduce

if TYPE_CHECKING:
    from .channel import Channel, Recv

__all__ = [
    "all_reduce", "broadcast", "reduce", "SMALL_MESSAGE_BYTES", "CHAIN_BROADCAST_MIN_RANKS",
    "HALVING_MIN_RANKS", "HALVING_MAX_BYTES",
]

# Below this, a call is latency-bound on loopback and on a LAN alike: one
# extra round costs more than moving the data log2(n) times.
SMALL_MESSAGE_BYTES = 64 * 1024

# A large broadcast goes down a pipelined chain only from this many ranks
# (MPICH's MPIR_CVAR_BCAST_MIN_PROCS has the same default). With fewer, a
# binomial tree's few rounds win even for large messages; and where ranks
# read each other's memory, each rank copies the message once either way.
CHAIN_BROADCAST_MIN_RANKS = 8

# A medium all-reduce takes Rabenseifner's halving and doubling from this
# many ranks (the ring: 14 messages per rank at 8, halving: 6) up to this
# size; above it the ring's pipelining of transfer and reduction wins.
HALVING_MIN_RANKS = 8
HALVING_MAX_BYTES = 4 << 20


def all_reduce(channel: Channel[Recv], buf: HostBuffer, op: object) -> Awaitable[None]:
    """All-reduce ``buf`` in place."""
    if buf.nbytes < SMALL_MESSAGE_BYTES or buf.numel < channel.size:
        return recursive_doubling_all_reduce(channel, buf, op)
    if channel.size >= HALVING_MIN_RANKS and buf.nbytes <= HALVING_MAX_BYTES:
        return halving_doubling_all_reduce(channel, buf, op)
    return ring_all_reduce(channel, buf, op)


def broadcast(channel: Channel[Recv], buf: HostBuffer, root: int) -> Awaitable[None]:
    """Broadcast the root's ``buf``."""
    if buf.nbytes < SMALL_MESSAGE_BYTES or channel.size < CHAIN_BROADCAST_MIN_RANKS:
        return binomial_broadcast(channel, buf, root)
    return chain_broadcast(channel, buf, root)


def reduce(channel: Channel[Recv], buf: HostBuffer, root: int, op: object) -> Awaitable[None]:
    """Reduce every rank's ``buf`` (an accumulator) into the root's."""
    if buf.nbytes < SMALL_MESSAGE_BYTES or channel.size <= 2:
        return binomial_reduce(channel, buf, root, op)
    return ring_reduce(channel, buf, root, op)



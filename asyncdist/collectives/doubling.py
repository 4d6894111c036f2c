"""Recursive doubling all-reduce: latency-optimal for small messages.

In round k every rank exchanges its whole buffer with the rank whose
(virtual) rank differs in bit k and combines; after log2(p) rounds every
rank holds the full result. For a size n that is not a power of two, the
first ``2 * (n - p)`` ranks first fold pairwise (odd ranks take their even
neighbour's data), the survivors run the doubling among p ranks, and the
folded ranks get the result back at the end (Thakur, Rabenseifner and
Gropp, 2005). Every rank ends with bit-identical data, since each pairwise
combine is commutative.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..reduce import kernels as ops
from ..buffers.host import HostBuffer, scratch_buffer
from .channel import sendrecv

if TYPE_CHECKING:
    from .channel import Channel, Recv

__all__ = ["recursive_doubling_all_reduce"]


async def recursive_doubling_all_reduce(channel: Channel[Recv], buf: HostBuffer, op: object) -> None:
    """All-reduce ``buf`` in place in ceil(log2 n) (+2 for odd sizes) rounds."""
    n, rank = channel.size, channel.rank
    if n == 1:
        return
    pof2 = 1 << (n.bit_length() - 1)
    extra = n - pof2
    incoming = scratch_buffer(buf.dtype, buf.numel)

    if rank < 2 * extra:
        if rank % 2 == 0:  # folded away: hand the data over, get the result back
            await channel.send(buf, rank + 1)
            await channel.recv(buf, rank + 1)
            return
        await channel.recv(incoming, rank - 1)
        ops.combine(op, buf, incoming)
        virtual = rank // 2
    else:
        virtual = rank - extra

    mask = 1
    while mask < pof2:
        partner_virtual = virtual ^ mask
        partner = partner_virtual * 2 + 1 if partner_virtual < extra else partner_virtual + extra
        await sendrecv(channel, buf, partner, incoming, partner)
        ops.combine(op, buf, incoming)
        mask <<= 1

    if rank < 2 * extra:
        await channel.send(buf, rank - 1)

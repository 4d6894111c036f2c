"""The dissemination barrier (Hensgen, Finkel and Manber, 1988).

In round k every rank signals rank + 2^k and waits for rank - 2^k (mod n);
after ceil(log2 n) rounds each rank has heard, directly or through others,
from every rank. Latency: ceil(log2 n) zero-byte messages on the critical
path, for any n (no power-of-two requirement).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..buffers.host import HostBuffer
from .channel import sendrecv

if TYPE_CHECKING:
    from .channel import Channel, Recv

__all__ = ["dissemination_barrier"]


# A barrier's messages are empty: this one buffer serves every send and receive
# of every barrier, as nothing is ever written into it.
_EMPTY = HostBuffer(memoryview(bytearray()), "uint8", (0,))


async def dissemination_barrier(channel: Channel[Recv]) -> None:
    """Return once every rank of the channel's group has entered the barrier."""
    rank, size = channel.rank, channel.size
    distance = 1
    while distance < size:
        await sendrecv(channel, _EMPTY, (rank + distance) % size, _EMPTY, (rank - distance) % size)
        distance *= 2

"""Pipelined chain broadcast: each rank sends the message once, in chunks.

For large messages on many ranks. A binomial tree sends the whole message
``log2 n`` times from the root; a scatter then ring all-gather (van de
Geijn) sends about ``2(n-1)/n`` of it from the root and ``n`` messages from
every rank. In a chain the ranks, renumbered from the root, pass the
message on to the next one, cut into ``k`` chunks so that all links carry
chunks at once: every rank but the last sends the message exactly once
(1.0x, the least any broadcast can do) in ``k`` messages, and the call takes
``(n - 2 + k)`` chunk-times.

The number of chunks balances the two terms: with a per-message cost
``a`` and a per-byte cost ``b``, ``(n - 2 + k)(a + b S / k)`` is least at
``k = sqrt((n - 2) b S / a)``. :data:`BALANCE_BYTES` is ``a / b``, the size
whose transfer costs as much as one message's overhead; chunks are never
smaller than :data:`MIN_CHUNK_BYTES`. Both ends of every link compute the
same cut from the size and n alone, so their messages match.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..buffers.host import ITEMSIZES, HostBuffer

if TYPE_CHECKING:
    from .channel import Channel, Recv

__all__ = ["chain_broadcast", "chain_chunks", "BALANCE_BYTES", "MIN_CHUNK_BYTES"]

# One message costs about as much as moving this many bytes: ~0.1-0.3 ms of
# headers, matching and wake-ups per large message here, against ~5 GB/s of
# copying. With 128 KiB a 16 MiB broadcast to 16 ranks in one loop took 3.1x
# as long as with 1 MiB (42 chunks against 15; median of 5 calls each,
# alternated), where pipelining gains nothing and every message costs.
BALANCE_BYTES = 1 << 20
# Smaller chunks are all overhead, and go over the socket rather than by
# memory (ASYNCDIST_CMA_MIN_BYTES is 512 KiB).
MIN_CHUNK_BYTES = 256 << 10


def chain_chunks(numel: int, itemsize: int, n: int) -> list[tuple[int, int]]:
    """The element ranges ``[a, b)`` a message of ``numel`` elements is cut
    into for a chain of ``n`` ranks (at least one, possibly empty)."""
    nbytes = numel * itemsize
    k = round(math.sqrt(max(1, n - 2) * nbytes / BALANCE_BYTES))
    k = max(1, min(k, nbytes // MIN_CHUNK_BYTES, numel))
    base, extra = divmod(numel, k)
    bounds, start = [], 0
    for i in range(k):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


async def chain_broadcast(channel: Channel[Recv], buf: HostBuffer, root: int) -> None:
    """Copy the root's ``buf`` into every rank's ``buf`` along the chain
    ``root, root + 1, ..`` (mod n), chunk by chunk."""
    n, rank = channel.size, channel.rank
    if n == 1:
        return
    relative = (rank - root) % n
    left, right = (rank - 1) % n, (rank + 1) % n
    chunks = [buf.elements(a, b) for a, b in chain_chunks(buf.numel, ITEMSIZES[buf.dtype], n)]
    forward = relative < n - 1
    if relative == 0:
        sends = [channel.start_send(chunk, right) for chunk in chunks]
    else:
        receives = [channel.start_recv(chunk, left) for chunk in chunks]
        sends = []
        try:
            for i, (chunk, recv) in enumerate(zip(chunks, receives)):
                await channel.wait_recv(recv, left)
                if forward:
                    sends.append(channel.start_send(chunk, right))
        except BaseException:
            for recv in receives[i:]:
                channel.withdraw(recv)
            raise
    for future in sends:
        await channel.wait_send(future, right)

"""Ring algorithms: bandwidth-optimal reduce-scatter and all-gather.

The data is cut into one *slot* per rank (slots may differ in size, or be
empty). In the reduce-scatter, slot ``s`` travels once around the ring and
every rank adds its contribution, so each rank sends and receives
``(n-1)/n`` of the data; in the all-gather, each finished slot travels
around once more. All-reduce is the two in a row (Patarasuk and Yuan, 2009).

Both are pipelined: every slot is cut into chunks, and a chunk is combined
and forwarded as soon as it arrives, so the reduction of one chunk overlaps
with the transfer of the next. Receives are posted ahead of the data (two
steps ahead in the reduce-scatter, all of them in the all-gather) so that
payloads land in their final buffers instead of being staged.

Extra memory: the reduce-scatter holds two receive buffers of the largest
slot (``2S/n``; one, ``S/2``, with two ranks); the all-gather none. Data
that arrives before its receive is posted is held in a buffer of its own
until then (the engine's unexpected queue): with two ranks at most one slot.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from .. import ops
from ..buffers import HostBuffer
from ..matching import PostedRecv
from ..scratch import pool
from .direct import direct_gather, direct_scatter

if TYPE_CHECKING:
    from ..channel import Channel

__all__ = [
    "even_slots",
    "ring_reduce_scatter",
    "ring_all_gather",
    "ring_all_reduce",
    "scatter_ring_broadcast",
    "ring_reduce",
]


def even_slots(buf: HostBuffer, parts: int) -> list[HostBuffer]:
    """Cut ``buf`` into ``parts`` contiguous slots whose sizes differ by at most one element."""
    base, extra = divmod(buf.numel, parts)
    slots, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        slots.append(buf.elements(start, stop))
        start = stop
    return slots


def _chunks(slot: HostBuffer, chunk_elems: int) -> list[tuple[int, int]]:
    n = slot.numel
    return [(a, min(a + chunk_elems, n)) for a in range(0, n, chunk_elems)]


async def _wait_sends(channel: Channel, sends: list, peer: int) -> None:
    for future in sends:
        await channel.wait_send(future, peer)


async def ring_reduce_scatter(channel: Channel, slots: Sequence[HostBuffer], op: object, chunk_elems: int) -> None:
    """Reduce ``slots`` across ranks in place: afterwards ``slots[rank]`` holds
    the combination of every rank's ``slots[rank]`` (other slots: partial sums).

    Every rank passes slots of the same sizes.
    """
    n, rank = channel.size, channel.rank
    if n == 1:
        return
    right, left = (rank + 1) % n, (rank - 1) % n
    largest = max(slot.numel for slot in slots)
    # Two receive buffers let step s+1's data land while step s is combined;
    # with two ranks there is only one step, so only one is needed.
    spare = [pool.take(slots[0].dtype, largest) for _ in range(min(2, n - 1))]

    def post(step: int) -> list[tuple[int, int, PostedRecv]]:
        # Step s brings this rank slot (rank - s - 2) from the left.
        slot = slots[(rank - step - 2) % n]
        into = spare[step % len(spare)]
        return [(a, b, channel.start_recv(into.elements(a, b), left)) for a, b in _chunks(slot, chunk_elems)]

    first = slots[(rank - 1) % n]
    sends = [channel.start_send(first.elements(a, b), right) for a, b in _chunks(first, chunk_elems)]
    ahead = post(0)
    upcoming: list[tuple[int, int, PostedRecv]] = []
    try:
        for step in range(n - 1):
            current, upcoming = ahead, (post(step + 1) if step + 1 < n - 1 else [])
            slot, received = slots[(rank - step - 2) % n], spare[step % len(spare)]
            for a, b, recv in current:
                await channel.wait_recv(recv, left)
                part = slot.elements(a, b)
                ops.combine(op, part, received.elements(a, b))
                if step + 1 < n - 1:
                    sends.append(channel.start_send(part, right))
            ahead = upcoming
    except BaseException:
        for _, _, recv in ahead + upcoming:
            channel.withdraw(recv)
        raise
    await _wait_sends(channel, sends, right)
    for buffer in spare:  # only after success: nothing of a failed call is reused
        pool.give_back(buffer)


async def ring_all_gather(channel: Channel, slots: Sequence[HostBuffer], chunk_elems: int) -> None:
    """Fill every slot from its owner: ``slots[rank]`` holds this rank's data
    on entry; afterwards every ``slots[i]`` holds rank ``i``'s."""
    n, rank = channel.size, channel.rank
    if n == 1:
        return
    right, left = (rank + 1) % n, (rank - 1) % n
    own = slots[rank]
    sends = [channel.start_send(own.elements(a, b), right) for a, b in _chunks(own, chunk_elems)]
    # Step s brings slot (rank - s - 1) from the left, in the order it is sent.
    posted = [
        (step, slots[(rank - step - 1) % n].elements(a, b))
        for step in range(n - 1)
        for a, b in _chunks(slots[(rank - step - 1) % n], chunk_elems)
    ]
    receives = [channel.start_recv(part, left) for _, part in posted]
    try:
        for i, ((step, part), recv) in enumerate(zip(posted, receives)):
            await channel.wait_recv(recv, left)
            if step < n - 2:
                sends.append(channel.start_send(part, right))
    except BaseException:
        for recv in receives[i:]:
            channel.withdraw(recv)
        raise
    await _wait_sends(channel, sends, right)


async def ring_all_reduce(channel: Channel, buf: HostBuffer, op: object, chunk_elems: int) -> None:
    """All-reduce ``buf`` in place: reduce-scatter, then all-gather."""
    slots = even_slots(buf, channel.size)
    await ring_reduce_scatter(channel, slots, op, chunk_elems)
    await ring_all_gather(channel, slots, chunk_elems)


async def scatter_ring_broadcast(channel: Channel, buf: HostBuffer, root: int, chunk_elems: int) -> None:
    """Broadcast for large messages (van de Geijn): the root scatters one slot
    to each rank, then a ring all-gather completes every copy. Each link
    carries about ``2S`` instead of a tree's ``S log2 n`` at the root."""
    slots = even_slots(buf, channel.size)
    await direct_scatter(channel, slots if channel.rank == root else None, slots[channel.rank], root)
    await ring_all_gather(channel, slots, chunk_elems)


async def ring_reduce(channel: Channel, buf: HostBuffer, root: int, op: object, chunk_elems: int) -> None:
    """Reduce for large messages (Rabenseifner): ring reduce-scatter, then the
    root gathers the finished slots. ``buf`` is every rank's accumulator."""
    slots = even_slots(buf, channel.size)
    await ring_reduce_scatter(channel, slots, op, chunk_elems)
    await direct_gather(channel, slots[channel.rank], slots if channel.rank == root else None, root)

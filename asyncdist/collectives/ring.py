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
payloads land in their final buffers instead of being staged. In the
reduce-scatter that final buffer is the slot itself: the receive *folds*
the chunk into it as it is read (:func:`asyncdist.reduce.kernels.folder`), so a chunk
read from a same-host peer's memory is added while it is still in cache,
and is never written to memory of its own.

Chunks are a link's choice, the same at both of its ends (see
:meth:`~asyncdist.collectives.channel.Channel.by_memory`): :data:`CHUNK_BYTES` over a
socket, where transfer and reduction overlap; :data:`MEMORY_CHUNK_BYTES`
between ranks that read each other's memory, where the receiver does the
copy itself, so there is nothing to overlap and every message only costs
its overhead. A rank whose two links differ sends a slot on in the chunks
of its right link, each as soon as the chunks from the left complete it.

Extra memory: none in proportion to the data but what the engine stages, a
chunk per peer for a folded message that comes over the socket, and data
that arrives before its receive is posted, held in a buffer of its own until
then (the engine's unexpected queue): with two ranks at most one slot.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from ..reduce import kernels as ops
from ..buffers.host import ITEMSIZES, HostBuffer
from .direct import direct_gather

if TYPE_CHECKING:
    import asyncio

    from .channel import Channel, Recv

__all__ = [
    "CHUNK_BYTES",
    "MEMORY_CHUNK_BYTES",
    "even_slots",
    "ring_reduce_scatter",
    "ring_all_gather",
    "ring_all_reduce",
    "ring_reduce",
]

# Pipelining unit over a socket: big enough that per-message overhead
# (~10 us) is noise, small enough that a ring of 8 overlaps well.
CHUNK_BYTES = 1 << 20
# The unit between ranks that read each other's memory. Each message costs
# about 0.1 ms there (its header, the DONE back, waking the algorithm) and
# overlaps nothing: an all_reduce of 64 MiB on 2 ranks took 0.73x the time
# of 1 MiB chunks in 16 MiB ones or larger, on 4 ranks 0.68-0.72x. Bounded,
# so that one message does not hold the loop for long.
MEMORY_CHUNK_BYTES = 64 << 20


def even_slots(buf: HostBuffer, parts: int) -> list[HostBuffer]:
    """Cut ``buf`` into ``parts`` contiguous slots whose sizes differ by at most one element."""
    base, extra = divmod(buf.numel, parts)
    slots, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        slots.append(buf.elements(start, stop))
        start = stop
    return slots


def _chunk_elements(channel: Channel[Recv], dtype: str, peer: int, *, sending: bool) -> int:
    """Elements per message on the link to (or from) group rank ``peer``."""
    nbytes = MEMORY_CHUNK_BYTES if channel.by_memory(peer, sending=sending) else CHUNK_BYTES
    return max(1, nbytes // ITEMSIZES[dtype])


def _chunks(numel: int, chunk_elems: int) -> list[tuple[int, int]]:
    return [(a, min(a + chunk_elems, numel)) for a in range(0, numel, chunk_elems)]


def _incoming(slot: HostBuffer, in_elems: int, out_elems: int, relay: bool) -> list[tuple[HostBuffer, list[HostBuffer]]]:
    """The chunks ``slot`` arrives in, each with the chunks to send on
    (``relay``) that it completes: the slot goes on in ``out_elems`` chunks
    as soon as the ``in_elems`` chunks before it have arrived."""
    outgoing = _chunks(slot.numel, out_elems) if relay else []
    result, next_out = [], 0
    for a, b in _chunks(slot.numel, in_elems):
        completed = []
        while next_out < len(outgoing) and outgoing[next_out][1] <= b:
            completed.append(slot.elements(*outgoing[next_out]))
            next_out += 1
        result.append((slot.elements(a, b), completed))
    return result


async def _wait_sends(channel: Channel[Recv], sends: list[asyncio.Future[None] | None], peer: int) -> None:
    for future in sends:
        await channel.wait_send(future, peer)


async def ring_reduce_scatter(channel: Channel[Recv], slots: Sequence[HostBuffer], op: object) -> None:
    """Reduce ``slots`` across ranks in place: afterwards ``slots[rank]`` holds
    the combination of every rank's ``slots[rank]`` (other slots: partial sums).

    Every rank passes slots of the same sizes.
    """
    n, rank = channel.size, channel.rank
    if n == 1:
        return
    right, left = (rank + 1) % n, (rank - 1) % n
    dtype = slots[0].dtype
    out_elems = _chunk_elements(channel, dtype, right, sending=True)
    in_elems = _chunk_elements(channel, dtype, left, sending=False)

    def post(step: int) -> list[tuple[Recv, list[HostBuffer]]]:
        # Step s folds slot (rank - s - 2) from the left into this rank's.
        # That slot is sent on only after step s, and slot (rank - 1), sent
        # first, is never folded into: no slot changes while a peer reads it.
        incoming = _incoming(slots[(rank - step - 2) % n], in_elems, out_elems, relay=step + 1 < n - 1)
        return [(channel.start_recv(part, left, ops.folder(op, part)), onward) for part, onward in incoming]

    first = slots[(rank - 1) % n]
    sends = [channel.start_send(first.elements(a, b), right) for a, b in _chunks(first.numel, out_elems)]
    ahead = post(0)
    upcoming: list[tuple[Recv, list[HostBuffer]]] = []
    try:
        for step in range(n - 1):
            current, upcoming = ahead, (post(step + 1) if step + 1 < n - 1 else [])
            for recv, onward in current:
                await channel.wait_recv(recv, left)
                sends.extend(channel.start_send(part, right) for part in onward)
            ahead = upcoming
    except BaseException:
        for recv, _ in ahead + upcoming:
            channel.withdraw(recv)
        raise
    await _wait_sends(channel, sends, right)


async def ring_all_gather(channel: Channel[Recv], slots: Sequence[HostBuffer]) -> None:
    """Fill every slot from its owner: ``slots[rank]`` holds this rank's data
    on entry; afterwards every ``slots[i]`` holds rank ``i``'s."""
    n, rank = channel.size, channel.rank
    if n == 1:
        return
    right, left = (rank + 1) % n, (rank - 1) % n
    dtype = slots[0].dtype
    out_elems = _chunk_elements(channel, dtype, right, sending=True)
    in_elems = _chunk_elements(channel, dtype, left, sending=False)
    own = slots[rank]
    sends = [channel.start_send(own.elements(a, b), right) for a, b in _chunks(own.numel, out_elems)]
    # Step s brings slot (rank - s - 1) from the left, in the order it is sent.
    incoming = [
        chunk
        for step in range(n - 1)
        for chunk in _incoming(slots[(rank - step - 1) % n], in_elems, out_elems, relay=step < n - 2)
    ]
    receives = [channel.start_recv(part, left) for part, _ in incoming]
    try:
        for i, ((_, onward), recv) in enumerate(zip(incoming, receives)):
            await channel.wait_recv(recv, left)
            sends.extend(channel.start_send(part, right) for part in onward)
    except BaseException:
        for recv in receives[i:]:
            channel.withdraw(recv)
        raise
    await _wait_sends(channel, sends, right)


async def ring_all_reduce(channel: Channel[Recv], buf: HostBuffer, op: object) -> None:
    """All-reduce ``buf`` in place: reduce-scatter, then all-gather."""
    slots = even_slots(buf, channel.size)
    await ring_reduce_scatter(channel, slots, op)
    await ring_all_gather(channel, slots)


async def ring_reduce(channel: Channel[Recv], buf: HostBuffer, root: int, op: object) -> None:
    """Reduce for large messages (Rabenseifner): ring reduce-scatter, then the
    root gathers the finished slots. ``buf`` is every rank's accumulator."""
    slots = even_slots(buf, channel.size)
    await ring_reduce_scatter(channel, slots, op)
    await direct_gather(channel, slots[channel.rank], slots if channel.rank == root else None, root)

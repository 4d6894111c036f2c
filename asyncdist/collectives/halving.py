"""Rabenseifner's all-reduce: recursive-halving reduce-scatter, then recursive-doubling all-gather.

For medium messages on many ranks. The ring moves the optimal ``2(n-1)/n``
of the data per rank but in ``2(n-1)`` messages (126 at n = 64), and each
message has a fixed cost (a header, a wake-up, a turn of the algorithm);
recursive doubling takes ``log2 n`` messages but moves all the data in each.
This takes ``2 log2 p`` messages per rank and still moves ``2(p-1)/p`` of
the data (Thakur, Rabenseifner and Gropp, 2005; MPICH's default for
all-reduce above 2 KiB):

* **reduce-scatter by recursive halving.** The buffer is cut into ``p``
  even slots. In round k (distance ``p/2, p/4, .., 1``) a rank exchanges
  half of the slots it is still responsible for with the partner at that
  distance: it sends the half the partner keeps, and folds the partner's
  copy of its own half into its buffer as it arrives
  (:func:`asyncdist.reduce.kernels.folder`), so no scratch buffer is
  needed. After ``log2 p`` rounds virtual rank ``v`` holds slot ``v``,
  reduced over every rank.
* **all-gather by recursive doubling.** The same exchanges backwards
  (distance ``1, 2, .., p/2``): each rank sends the range it holds and
  receives its partner's, which is the other half of the next larger range.

Sizes that are not a power of two fold first, as
:mod:`asyncdist.collectives.doubling` does: of the first ``2 (n - p)``
ranks each even one hands its buffer to its odd neighbour, which folds it
in; the ``p`` survivors run the algorithm and each folded rank gets the
result back from its neighbour. That costs those neighbours one more
message each way and one more buffer's worth of bytes (sent and received),
the price of staying at ``2 log2 p + 1`` messages.

Every slot's final value is computed by one rank and copied from there, so
every rank ends with bit-identical data. Extra memory: none; folded
messages go straight into the buffer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..buffers.host import HostBuffer
from ..reduce import kernels as ops
from .channel import sendrecv
from .ring import even_slots

if TYPE_CHECKING:
    from .channel import Channel, Recv

__all__ = ["halving_doubling_all_reduce", "halving_rounds"]


Range = tuple[int, int]


def halving_rounds(virtual: int, pof2: int) -> list[tuple[int, Range, Range]]:
    """The reduce-scatter's rounds for virtual rank ``virtual`` of ``pof2``, as
    ``(partner, kept, given)``: slot ranges ``[first, stop)``; this rank keeps
    (and folds its partner's copy into) ``kept`` and sends ``given``.

    The all-gather replays them in reverse order, sending ``kept`` and
    receiving ``given``.
    """
    rounds: list[tuple[int, Range, Range]] = []
    lo, hi, mask = 0, pof2, pof2 >> 1
    while mask:
        mid = (lo + hi) // 2
        if virtual & mask:
            rounds.append((virtual ^ mask, (mid, hi), (lo, mid)))
            lo = mid
        else:
            rounds.append((virtual ^ mask, (lo, mid), (mid, hi)))
            hi = mid
        mask >>= 1
    return rounds


async def halving_doubling_all_reduce(channel: Channel[Recv], buf: HostBuffer, op: object) -> None:
    """All-reduce ``buf`` in place in ``2 log2 p`` messages per rank (+1 each way
    for the ranks that fold, when n is not a power of two ``p``)."""
    n, rank = channel.size, channel.rank
    if n == 1:
        return
    pof2 = 1 << (n.bit_length() - 1)
    extra = n - pof2
    if rank < 2 * extra:
        if rank % 2 == 0:  # folded away: hand the data over, get the result back
            await channel.send(buf, rank + 1)
            await channel.recv(buf, rank + 1)
            return
        await channel.wait_recv(channel.start_recv(buf, rank - 1, ops.folder(op, buf)), rank - 1)
        virtual = rank // 2
    else:
        virtual = rank - extra

    def real(v: int) -> int:
        return v * 2 + 1 if v < extra else v + extra

    starts = [0]
    for slot in even_slots(buf, pof2):
        starts.append(starts[-1] + slot.numel)

    def span(slots: Range) -> HostBuffer:
        """Slots ``[first, stop)`` as one buffer (they are contiguous)."""
        return buf.elements(starts[slots[0]], starts[slots[1]])

    rounds = halving_rounds(virtual, pof2)
    for partner, kept, given in rounds:
        into = span(kept)
        await sendrecv(channel, span(given), real(partner), into, real(partner), ops.folder(op, into))
    for partner, kept, given in reversed(rounds):
        await sendrecv(channel, span(kept), real(partner), span(given), real(partner))

    if rank < 2 * extra:
        await channel.send(buf, rank - 1)

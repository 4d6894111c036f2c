"""Direct exchanges: every pair talks at once (gather, scatter, all-to-all).

The root of a gather or scatter posts all its receives (or starts all its
sends) together, so the transfers proceed concurrently and payloads land
in their final slots; the all-to-all does the same for every pair. With n
ranks on a few hosts these are bandwidth-bound at the root (or everywhere,
for all-to-all), which no tree improves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from ..buffers.host import HostBuffer

if TYPE_CHECKING:
    from .channel import Channel, Recv

__all__ = ["direct_gather", "direct_scatter", "direct_all_to_all"]


def copy_into(dst: HostBuffer, src: HostBuffer) -> None:
    """Copy ``src``'s bytes into ``dst`` (same size; the same memory is fine)."""
    dst.view[:] = src.view


async def _exchange(channel: Channel[Recv], sends: dict[int, HostBuffer], receives: dict[int, HostBuffer]) -> None:
    posted = {peer: channel.start_recv(buf, peer) for peer, buf in receives.items()}
    started = []
    try:
        started = [(channel.start_send(buf, peer), peer) for peer, buf in sends.items()]
        for peer, recv in posted.items():
            await channel.wait_recv(recv, peer)
    except BaseException:
        for recv in posted.values():
            channel.withdraw(recv)
        raise
    for future, peer in started:
        await channel.wait_send(future, peer)


async def direct_gather(channel: Channel[Recv], send: HostBuffer, slots: Sequence[HostBuffer] | None, root: int) -> None:
    """Every rank's ``send`` lands in the root's ``slots[rank]``."""
    if channel.rank == root:
        assert slots is not None
        copy_into(slots[root], send)
        await _exchange(channel, {}, {peer: slots[peer] for peer in range(channel.size) if peer != root})
    else:
        await channel.send(send, root)


async def direct_scatter(channel: Channel[Recv], slots: Sequence[HostBuffer] | None, recv: HostBuffer, root: int) -> None:
    """The root's ``slots[rank]`` lands in every rank's ``recv``."""
    if channel.rank == root:
        assert slots is not None
        copy_into(recv, slots[root])
        await _exchange(channel, {peer: slots[peer] for peer in range(channel.size) if peer != root}, {})
    else:
        await channel.recv(recv, root)


async def direct_all_to_all(channel: Channel[Recv], sends: Sequence[HostBuffer], receives: Sequence[HostBuffer]) -> None:
    """``sends[j]`` of rank i lands in ``receives[i]`` of rank j."""
    rank = channel.rank
    copy_into(receives[rank], sends[rank])
    others = [peer for peer in range(channel.size) if peer != rank]
    await _exchange(channel, {peer: sends[peer] for peer in others}, {peer: receives[peer] for peer in others})

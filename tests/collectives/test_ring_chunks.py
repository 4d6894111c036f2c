"""The ring's messages: chunked per link, relayed in the next link's chunks.

A link between ranks that read each other's memory carries a slot in
larger chunks than a socket link. Both ends of a link agree on which it is,
but the two links of one rank may differ, and then a slot arrives in one
size of chunk and goes on in another. Here the sizes are made small and
unrelated (3 and 5 KiB), and the links differ by the parity of their
sender, so that every ring of 3 to 5 ranks mixes them; the results are
checked against NumPy on the gathered inputs.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from asyncdist.buffers.host import as_host_buffer
from asyncdist.engine.channel import Channel
from asyncdist.collectives import ring
from asyncdist.reduce.kernels import ReduceOp
from asyncdist.testing import local_world

COUNT = 70_001  # float32 elements: 273 KiB, a ring-sized call with uneven slots


@pytest.fixture
def mixed_links(monkeypatch: pytest.MonkeyPatch) -> None:
    """Links from even group ranks count as "by memory", the others not."""

    def by_memory(self: Channel, peer: int, *, sending: bool) -> bool:
        sender = self.rank if sending else peer
        return sender % 2 == 0

    monkeypatch.setattr(Channel, "by_memory", by_memory)
    monkeypatch.setattr(ring, "CHUNK_BYTES", 3 << 10)
    monkeypatch.setattr(ring, "MEMORY_CHUNK_BYTES", 5 << 10)


def _inputs(n: int) -> list[np.ndarray]:
    return [np.random.default_rng([7, r]).integers(-50, 50, COUNT).astype(np.float32) for r in range(n)]


@pytest.mark.parametrize("n", [3, 4, 5])
async def test_all_reduce_and_reduce_scatter_over_links_of_two_chunk_sizes(mixed_links: None, n: int) -> None:
    inputs = _inputs(n)
    sums = [x.copy() for x in inputs]
    block = COUNT // n
    scattered = [np.empty(block, np.float32) for _ in range(n)]
    async with local_world(n) as ranks:
        await asyncio.gather(*(g.all_reduce(sums[g.rank]) for g in ranks))
        await asyncio.gather(*(
            g.reduce_scatter_tensor(scattered[g.rank], inputs[g.rank][: block * n], ReduceOp.MAX) for g in ranks
        ))
    expected_sum = np.sum(inputs, axis=0, dtype=np.float32)
    expected_max = np.max(inputs, axis=0)[: block * n].reshape(n, block)
    for r in range(n):
        np.testing.assert_array_equal(sums[r], expected_sum)
        np.testing.assert_array_equal(scattered[r], expected_max[r])


@pytest.mark.parametrize("n", [3, 4, 5])
async def test_all_gather_over_links_of_two_chunk_sizes(mixed_links: None, n: int) -> None:
    inputs = _inputs(n)
    gathered = [np.empty(COUNT * n, np.float32) for _ in range(n)]
    async with local_world(n) as ranks:
        await asyncio.gather(*(g.all_gather_into_tensor(gathered[g.rank], inputs[g.rank]) for g in ranks))
    for r in range(n):
        np.testing.assert_array_equal(gathered[r], np.concatenate(inputs))


@pytest.mark.parametrize(("in_elems", "out_elems"), [(4, 4), (3, 5), (5, 3), (1, 10), (10, 1), (4, 100)])
def test_a_slot_goes_on_in_the_next_links_chunks_once_they_have_arrived(in_elems: int, out_elems: int) -> None:
    slot = as_host_buffer(np.arange(10, dtype=np.int32), writable=True)  # each element its index
    incoming = ring._incoming(slot, in_elems, out_elems, relay=True)
    arrived, relayed = 0, []
    for part, onward in incoming:
        assert part.numel <= in_elems
        arrived += part.numel
        for chunk in onward:
            start = int(np.frombuffer(chunk.view, np.int32)[0])
            assert start == sum(c.numel for c in relayed), "sent on in order, without gaps"
            assert start + chunk.numel <= arrived, "sent on only once all of it has arrived"
            assert chunk.numel == min(out_elems, 10 - start)
            relayed.append(chunk)
    assert arrived == 10 and sum(c.numel for c in relayed) == 10
    assert all(not onward for _, onward in ring._incoming(slot, in_elems, out_elems, relay=False))

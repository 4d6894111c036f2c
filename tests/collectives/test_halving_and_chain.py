"""Rabenseifner's all-reduce and the chain broadcast: values, messages and bytes per rank.

The values are checked against NumPy on the gathered inputs for every group
size from 1 to 17 (powers of two and not, odd element counts, counts below
the number of slots). The messages and bytes each rank sends are counted
on the in-memory network, and once on real ranks (``local_world``), and
held to what the algorithms promise: at most ``2 ceil(log2 n) + 2``
messages per rank for an all-reduce, the ring's ``2(n-1)/n`` of the data
when n is a power of two, and a broadcast that sends the message at most
once per rank.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from asyncdist.buffers.host import HostBuffer, as_host_buffer
from asyncdist.collectives import chain, halving, select
from asyncdist.collectives.in_memory import InMemoryChannel, InMemoryNetwork, run_ranks
from asyncdist.engine.channel import Channel
from asyncdist.reduce.kernels import ReduceOp
from asyncdist.testing import local_world


class Sent:
    """Messages and bytes sent, per rank."""

    def __init__(self) -> None:
        self.messages: Counter[int] = Counter()
        self.bytes: Counter[int] = Counter()

    def add(self, rank: int, buf: HostBuffer) -> None:
        self.messages[rank] += 1
        self.bytes[rank] += buf.nbytes


@pytest.fixture
def sent_in_memory(monkeypatch: pytest.MonkeyPatch) -> Iterator[Sent]:
    sent, send = Sent(), InMemoryNetwork.send

    def counting(self: InMemoryNetwork, src: int, dst: int, tag: int, buf: HostBuffer) -> Any:
        sent.add(src, buf)
        return send(self, src, dst, tag, buf)

    monkeypatch.setattr(InMemoryNetwork, "send", counting)
    yield sent


def inputs(n: int, count: int) -> list[np.ndarray]:
    return [np.random.default_rng([n, count, r]).integers(-100, 100, count).astype(np.float64) for r in range(n)]


def all_reduce_in_memory(n: int, count: int, algorithm: Any = halving.halving_doubling_all_reduce) -> list[np.ndarray]:
    bufs = [x.copy() for x in inputs(n, count)]

    async def body(channel: InMemoryChannel) -> None:
        await algorithm(channel, as_host_buffer(bufs[channel.rank], writable=True), ReduceOp.SUM)

    asyncio.run(run_ranks(n, body))
    return bufs


@pytest.mark.parametrize("n", range(1, 18))
def test_halving_all_reduce_sums_like_numpy(n: int) -> None:
    for count in (1, n - 1 or 1, n, 3 * n + 1, 257):
        expected = np.sum(inputs(n, count), axis=0)
        for result in all_reduce_in_memory(n, count):
            np.testing.assert_array_equal(result, expected)


@pytest.mark.parametrize("n", [16, 17, 24, 31, 32, 33, 64])
def test_halving_all_reduce_messages_and_bytes_per_rank(sent_in_memory: Sent, n: int) -> None:
    count = 64 * 1024 // 8 + 3  # uneven slots
    all_reduce_in_memory(n, count)
    pof2 = 1 << (n.bit_length() - 1)
    nbytes = count * 8
    assert max(sent_in_memory.messages.values()) <= 2 * math.ceil(math.log2(n)) + 2
    assert max(sent_in_memory.messages.values()) == 2 * int(math.log2(pof2)) + (n != pof2)
    optimum = 2 * (pof2 - 1) / pof2 * nbytes
    for rank in range(n):
        folded = rank < 2 * (n - pof2)
        limit = nbytes if folded and rank % 2 == 0 else optimum + (nbytes if folded else 0)
        assert sent_in_memory.bytes[rank] <= limit + 2 * 8 * math.log2(pof2)  # slots differ by an element


def broadcast_in_memory(n: int, count: int, root: int) -> list[np.ndarray]:
    data = inputs(1, count)[0]
    bufs = [data.copy() if r == root else np.zeros(count) for r in range(n)]

    async def body(channel: InMemoryChannel) -> None:
        await chain.chain_broadcast(channel, as_host_buffer(bufs[channel.rank], writable=True), root)

    asyncio.run(run_ranks(n, body))
    for buf in bufs:
        np.testing.assert_array_equal(buf, data)
    return bufs


@pytest.mark.parametrize("n", range(1, 18))
def test_chain_broadcast_copies_the_roots_buffer(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    monkeypatch.setattr(chain, "MIN_CHUNK_BYTES", 8)
    monkeypatch.setattr(chain, "BALANCE_BYTES", 16)
    for root in {0, n // 2, n - 1}:
        for count in (1, 7, 1001):
            broadcast_in_memory(n, count, root)


@pytest.mark.parametrize("n", [8, 17, 64])
def test_chain_broadcast_sends_the_message_once_per_rank(sent_in_memory: Sent, n: int) -> None:
    count = (1 << 20) // 8 + 5
    broadcast_in_memory(n, count, root=3)
    assert set(sent_in_memory.bytes.values()) == {count * 8}  # each rank but the last, exactly once
    assert len(sent_in_memory.bytes) == n - 1 and (3 - 1) % n not in sent_in_memory.bytes
    assert len(chain.chain_chunks(count, 8, n)) == max(sent_in_memory.messages.values())


@pytest.mark.parametrize("nbytes", [64 << 10, 4 << 20])
def test_select_takes_halving_for_medium_all_reduces_on_many_ranks(sent_in_memory: Sent, nbytes: int) -> None:
    count, n = nbytes // 8, 16
    results = all_reduce_in_memory(n, count, select.all_reduce)
    np.testing.assert_array_equal(results[5], np.sum(inputs(n, count), axis=0))
    assert max(sent_in_memory.messages.values()) == 8


def test_chunks_cover_the_message_in_order() -> None:
    for numel, n in ((1, 8), (100, 8), (1 << 20, 64), (4 << 20, 8)):
        bounds = chain.chain_chunks(numel, 4, n)
        assert bounds[0][0] == 0 and bounds[-1][1] == numel
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
        assert all(b - a >= 1 for a, b in bounds)


async def test_on_real_ranks_at_16(monkeypatch: pytest.MonkeyPatch) -> None:
    sent, start_send = Sent(), Channel.start_send

    def counting(self: Channel, buf: HostBuffer, peer: int) -> Any:
        sent.add(self.rank, buf)
        return start_send(self, buf, peer)

    monkeypatch.setattr(Channel, "start_send", counting)
    # 1 MiB: the first round's halves go by memory (from 512 KiB), the later ones over the socket.
    n, count = 16, (1 << 20) // 4 + 1
    data = inputs(n, count)
    sums = [x.astype(np.float32) for x in data]
    copies = [sums[0].copy() if r == 0 else np.zeros(count, np.float32) for r in range(n)]
    async with local_world(n) as ranks:
        sent.messages.clear(), sent.bytes.clear()  # what starting the world sent
        await asyncio.gather(*(g.all_reduce(sums[g.rank]) for g in ranks))
        reduce_sent = (max(sent.messages.values()), max(sent.bytes.values()))
        sent.messages.clear(), sent.bytes.clear()
        await asyncio.gather(*(g.broadcast(copies[g.rank], 0) for g in ranks))
    expected = np.sum(np.array(data, np.float32), axis=0, dtype=np.float32)
    for r in range(n):
        np.testing.assert_array_equal(sums[r], expected)  # integers: exact in any order
        np.testing.assert_array_equal(copies[r], data[0].astype(np.float32))
    assert reduce_sent[0] == 8 and reduce_sent[1] <= 2 * 15 / 16 * count * 4 + 64
    assert max(sent.bytes.values()) == count * 4  # the broadcast: once per rank

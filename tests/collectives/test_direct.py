"""The direct exchanges (gather, scatter, all-to-all) in small worked cases (on the
in-memory channel; test_algorithms_in_memory.py has the properties)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from asyncdist.buffers.host import HostBuffer, as_host_buffer
from asyncdist.collectives.direct import (
    copy_into,
    direct_all_to_all,
    direct_gather,
    direct_scatter,
)
from asyncdist.collectives.in_memory import InMemoryChannel, run_ranks
from asyncdist.errors import BufferMismatchError


def host(array: np.ndarray) -> HostBuffer:
    return as_host_buffer(array, writable=True)


def run(n: int, per_rank) -> list:
    return asyncio.run(run_ranks(n, per_rank))


def test_direct_gather_puts_each_rank_in_its_slot_at_the_root() -> None:
    slots = [np.zeros(2, np.uint8) for _ in range(4)]

    async def gather(channel: InMemoryChannel) -> None:
        mine = np.array([channel.rank, channel.rank + 100], np.uint8)
        await direct_gather(channel, host(mine), [host(s) for s in slots] if channel.rank == 1 else None, 1)

    run(4, gather)
    assert [s.tolist() for s in slots] == [[r, r + 100] for r in range(4)]


def test_direct_scatter_gives_each_rank_its_slot() -> None:
    received = [np.zeros(1, np.float32) for _ in range(3)]
    slots = [np.array([10.0 * r], np.float32) for r in range(3)]

    async def scatter(channel: InMemoryChannel) -> None:
        root_slots = [host(s) for s in slots] if channel.rank == 0 else None
        await direct_scatter(channel, root_slots, host(received[channel.rank]), 0)

    run(3, scatter)
    assert [r.tolist() for r in received] == [[0.0], [10.0], [20.0]]


def test_direct_all_to_all_transposes_with_uneven_parts() -> None:
    # Rank i sends i + j elements, all equal to 10 * i + j, to rank j.
    n = 3
    sends = [[np.full(i + j, 10 * i + j, np.int64) for j in range(n)] for i in range(n)]
    receives = [[np.zeros(i + j, np.int64) for i in range(n)] for j in range(n)]

    async def all_to_all(channel: InMemoryChannel) -> None:
        r = channel.rank
        await direct_all_to_all(channel, [host(a) for a in sends[r]], [host(a) for a in receives[r]])

    run(n, all_to_all)
    for i in range(n):
        for j in range(n):
            assert receives[j][i].tolist() == [10 * i + j] * (i + j)


def test_a_gather_slot_of_the_wrong_size_fails_with_buffer_mismatch() -> None:
    async def gather(channel: InMemoryChannel) -> None:
        slots = [host(np.zeros(2)), host(np.zeros(3))] if channel.rank == 0 else None
        await direct_gather(channel, host(np.zeros(2)), slots, 0)

    with pytest.raises(BufferMismatchError, match="rank 1 sent float64\\[2\\]"):
        run(2, gather)


def test_copy_into_copies_bytes_and_tolerates_the_same_memory() -> None:
    src, dst = np.arange(4, dtype=np.int32), np.zeros(4, np.int32)
    copy_into(host(dst), host(src))
    copy_into(host(dst), host(dst))
    assert dst.tolist() == [0, 1, 2, 3]

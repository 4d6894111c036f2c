"""The binomial trees: their shape, broadcast and reduce, in small worked cases
(on the in-memory channel; test_algorithms_in_memory.py has the properties)."""

from __future__ import annotations

import asyncio

import numpy as np

from asyncdist.buffers.host import HostBuffer, as_host_buffer
from asyncdist.collectives.in_memory import run_ranks
from asyncdist.collectives.tree import (
    _parent_and_children,
    binomial_broadcast,
    binomial_reduce,
)
from asyncdist.reduce.kernels import ReduceOp


def host(array: np.ndarray) -> HostBuffer:
    return as_host_buffer(array, writable=True)


def run(n: int, per_rank) -> list:
    return asyncio.run(run_ranks(n, per_rank))


def test_the_binomial_tree_of_six_ranks() -> None:
    # 0 -> 4, 2, 1; 2 -> 3; 4 -> 5: children in decreasing subtree size.
    shape = {relative: _parent_and_children(relative, 6) for relative in range(6)}
    assert shape == {0: (None, [4, 2, 1]), 1: (0, []), 2: (0, [3]), 3: (2, []), 4: (0, [5]), 5: (4, [])}


def test_binomial_broadcast_from_rank_two_of_five() -> None:
    data = [np.full(3, r, np.int32) for r in range(5)]
    run(5, lambda channel: binomial_broadcast(channel, host(data[channel.rank]), 2))
    assert all(array.tolist() == [2, 2, 2] for array in data)


def test_binomial_reduce_sums_into_the_root_only() -> None:
    data = [np.array([r, 10 * r], np.int64) for r in range(7)]
    run(7, lambda channel: binomial_reduce(channel, host(data[channel.rank]), 6, ReduceOp.SUM))
    assert data[6].tolist() == [21, 210]


def test_binomial_reduce_with_max_on_one_rank_is_the_input() -> None:
    data = np.array([3.0, -1.0])
    run(1, lambda channel: binomial_reduce(channel, host(data), 0, ReduceOp.MAX))
    assert data.tolist() == [3.0, -1.0]

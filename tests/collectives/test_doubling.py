"""Recursive doubling in small worked cases, power-of-two sizes and not (on the
in-memory channel; test_algorithms_in_memory.py has the properties)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from asyncdist.buffers.host import HostBuffer, as_host_buffer
from asyncdist.collectives.doubling import recursive_doubling_all_reduce
from asyncdist.collectives.in_memory import run_ranks
from asyncdist.reduce.kernels import ReduceOp


def host(array: np.ndarray) -> HostBuffer:
    return as_host_buffer(array, writable=True)


def run(n: int, per_rank) -> list:
    return asyncio.run(run_ranks(n, per_rank))


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7, 8])
def test_recursive_doubling_gives_every_rank_the_same_sum(n: int) -> None:
    data = [np.array([r + 1, -r], np.int16) for r in range(n)]
    run(n, lambda channel: recursive_doubling_all_reduce(channel, host(data[channel.rank]), ReduceOp.SUM))
    expected = [n * (n + 1) // 2, -n * (n - 1) // 2]
    assert [array.tolist() for array in data] == [expected] * n


def test_recursive_doubling_of_three_ranks_multiplies_across_the_fold() -> None:
    # n = 3: rank 0 hands its data to rank 1 and gets the result back.
    data = [np.array([r + 1.0, 0.5]) for r in range(3)]
    run(3, lambda channel: recursive_doubling_all_reduce(channel, host(data[channel.rank]), ReduceOp.PRODUCT))
    assert [array.tolist() for array in data] == [[6.0, 0.125]] * 3


def test_recursive_doubling_of_bool_min_is_a_logical_and() -> None:
    data = [np.array([True, True, r != 2]) for r in range(5)]
    run(5, lambda channel: recursive_doubling_all_reduce(channel, host(data[channel.rank]), ReduceOp.MIN))
    assert [array.tolist() for array in data] == [[True, True, False]] * 5

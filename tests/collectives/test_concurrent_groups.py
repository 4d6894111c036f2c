"""Collectives on different groups run at the same time in one loop without mixing."""

from __future__ import annotations

import asyncio

import numpy as np

from asyncdist.reduce.kernels import ReduceOp
from asyncdist.testing import local_world


async def test_two_groups_run_different_collectives_at_the_same_time() -> None:
    n = 4
    async with local_world(n) as ranks:
        # Overlapping groups: ranks 1 and 2 are in both, and run both calls at once.
        low = [g.new_group([0, 1, 2]) for g in ranks]
        high = [g.new_group([1, 2, 3]) for g in ranks]
        sums = [np.full(50_000, float(r + 1)) for r in range(n)]  # large: the pipelined ring
        gathered = [np.zeros(3 * 7, dtype=np.int32) for _ in range(n)]
        maxima = [np.array([r * 10, -r], dtype=np.int64) for r in range(n)]

        async def rank_program(r: int) -> None:
            calls = []
            if low[r].rank >= 0:
                calls.append(low[r].all_reduce(sums[r]))
            if high[r].rank >= 0:
                calls.append(high[r].all_gather_into_tensor(gathered[r], np.full(7, r, dtype=np.int32)))
            calls.append(ranks[r].all_reduce(maxima[r], ReduceOp.MAX))  # the world, at the same time
            await asyncio.gather(*calls)

        await asyncio.gather(*(rank_program(r) for r in range(n)))

    for r in range(3):
        np.testing.assert_array_equal(sums[r], np.full(50_000, 1.0 + 2.0 + 3.0))
    np.testing.assert_array_equal(sums[3], np.full(50_000, 4.0))  # not a member: untouched
    for r in range(1, 4):
        np.testing.assert_array_equal(gathered[r], np.repeat(np.array([1, 2, 3], dtype=np.int32), 7))
    np.testing.assert_array_equal(gathered[0], np.zeros(21, dtype=np.int32))
    for r in range(n):
        np.testing.assert_array_equal(maxima[r], [30, 0])


async def test_many_concurrent_calls_on_one_group_keep_their_order() -> None:
    async with local_world(3) as ranks:
        tensors = [[np.full(100, float(r * 100 + i)) for i in range(20)] for r in range(3)]
        await asyncio.gather(*(
            asyncio.gather(*(g.all_reduce(t) for t in tensors[g.rank])) for g in ranks
        ))
    for i in range(20):
        expected = float(sum(r * 100 + i for r in range(3)))
        for r in range(3):
            np.testing.assert_array_equal(tensors[r][i], np.full(100, expected))

"""Ranks that disagree about a collective get CollectiveMismatchError, not garbage."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from asyncdist.errors import CollectiveMismatchError, PeerLostError
from asyncdist.reduce.kernels import ReduceOp
from asyncdist.testing import local_world


async def outcomes(*calls) -> list[BaseException | None]:
    results = await asyncio.gather(*calls, return_exceptions=True)
    return [r if isinstance(r, BaseException) else None for r in results]


async def test_different_sizes_are_a_mismatch_naming_both_calls() -> None:
    async with local_world(2) as (a, b):
        results = await outcomes(a.all_reduce(np.ones(4, np.float32)), b.all_reduce(np.ones(5, np.float32)))
    assert all(isinstance(r, CollectiveMismatchError) for r in results)
    message = str(results[0])
    assert "all_reduce(sum, float32[4])" in message and "all_reduce(sum, float32[5])" in message


async def test_different_ops_dtypes_and_roots_are_mismatches() -> None:
    async with local_world(2) as (a, b):
        ops = await outcomes(a.all_reduce(np.ones(3)), b.all_reduce(np.ones(3), ReduceOp.MAX))
        dtypes = await outcomes(a.all_reduce(np.ones(3)), b.all_reduce(np.ones(3, np.float32)))
        roots = await outcomes(a.broadcast(np.ones(3), 0), b.broadcast(np.ones(3), 1))
        # Both ranks think they are the root and only send, so neither can tell
        # during the call; the message nobody received fails the next call.
        after = await outcomes(a.barrier(), b.barrier())
    assert all(isinstance(r, CollectiveMismatchError) for r in ops + dtypes)
    assert roots == [None, None]
    assert all(isinstance(r, CollectiveMismatchError) for r in after)
    assert "broadcast(src=1, float64[3])" in str(after[0]) and "broadcast(src=0, float64[3])" in str(after[1])


async def test_different_collectives_are_a_mismatch_and_the_group_stays_usable() -> None:
    async with local_world(3) as ranks:
        results = await outcomes(
            ranks[0].all_reduce(np.ones(2)), ranks[1].all_reduce(np.ones(2)), ranks[2].barrier()
        )
        # Ranks 1 and 2 see each other's messages; rank 0, which waits on rank 1,
        # hears of it through rank 1's ABORT instead of waiting for its timeout.
        assert all(isinstance(r, CollectiveMismatchError) for r in results)
        assert "relayed by rank" in str(results[0])
        after = [np.full(2, float(g.rank)) for g in ranks]
        await asyncio.gather(*(g.all_reduce(x) for g, x in zip(ranks, after)))
    for x in after:
        np.testing.assert_array_equal(x, [3.0, 3.0])


async def test_a_crashed_member_fails_a_collective_waiting_on_another_live_member(virtual_clock) -> None:
    async with local_world(3) as (a, b, c):
        # Rank 2 enters an all_reduce and waits on rank 1, which has not entered yet.
        waiting = asyncio.ensure_future(c.all_reduce(np.ones(2)))
        await asyncio.sleep(0)
        a.engine._connections[2].close()  # rank 0's stream to rank 2 breaks, as in a crash
        with pytest.raises(PeerLostError, match="rank 0") as info:
            await asyncio.wait_for(waiting, 5)
        assert info.value.rank == 0

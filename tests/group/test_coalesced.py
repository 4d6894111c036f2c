"""The coalesced collectives: one call per dtype, whatever the number of tensors.

Three ranks in one loop; every result is checked against NumPy on the
gathered inputs, and the number of calls against the flight recorder.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from asyncdist.errors import CollectiveMismatchError, InvalidArgumentError
from asyncdist.reduce.op import ReduceOp
from asyncdist.testing import local_world

N = 3
SIZES = (3, 1, 5)  # float32 tensors; an int64 one follows: two dtypes, two calls


def _inputs(rank: int) -> list[np.ndarray]:
    rng = np.random.default_rng([11, rank])
    return [rng.standard_normal(n).astype(np.float32) for n in SIZES] + [rng.integers(-9, 9, 4)]


def _recorded(groups: list) -> list[int]:
    return [g.calls.engine.flight.recorder.recorded for g in groups]


async def test_all_reduce_coalesced_sums_each_tensor_in_one_call_per_dtype() -> None:
    async with local_world(N) as groups:
        tensors = [_inputs(r) for r in range(N)]
        before = _recorded(groups)
        await asyncio.gather(*(g.all_reduce_coalesced(tensors[r], ReduceOp.MAX) for r, g in enumerate(groups)))
        assert [after - was for after, was in zip(_recorded(groups), before)] == [2] * N
        for i in range(len(SIZES) + 1):
            want = np.max([_inputs(r)[i] for r in range(N)], axis=0)
            for r in range(N):
                np.testing.assert_array_equal(tensors[r][i], want)


async def test_all_gather_into_tensor_coalesced_concatenates_each_tensor_in_rank_order() -> None:
    async with local_world(N) as groups:
        outputs = [[np.zeros(N * t.size, t.dtype) for t in _inputs(r)] for r in range(N)]
        before = _recorded(groups)
        await asyncio.gather(*(g.all_gather_into_tensor_coalesced(outputs[r], _inputs(r))
                               for r, g in enumerate(groups)))
        assert [after - was for after, was in zip(_recorded(groups), before)] == [2] * N
        for i in range(len(SIZES) + 1):
            want = np.concatenate([_inputs(r)[i] for r in range(N)])
            for r in range(N):
                np.testing.assert_array_equal(outputs[r][i], want)


async def test_reduce_scatter_tensor_coalesced_gives_each_rank_its_part_of_each_sum() -> None:
    async with local_world(N) as groups:
        wholes = [[np.concatenate([t * (k + 1) for k in range(N)]) for t in _inputs(r)] for r in range(N)]
        outputs = [[np.zeros_like(t) for t in _inputs(r)] for r in range(N)]
        await asyncio.gather(*(g.reduce_scatter_tensor_coalesced(outputs[r], wholes[r])
                               for r, g in enumerate(groups)))
        for i, size in enumerate((*SIZES, 4)):
            total = np.sum([wholes[r][i] for r in range(N)], axis=0)
            for r in range(N):
                np.testing.assert_allclose(outputs[r][i], total[r * size:(r + 1) * size], rtol=1e-6)


async def test_ranks_that_split_the_same_total_differently_fail_naming_both_calls() -> None:
    async with local_world(2) as groups:
        splits = [(2, 3), (3, 2)]  # 5 elements each: a packed buffer alone would not tell them apart
        tensors = [[np.ones(n, np.float32) for n in split] for split in splits]
        results = await asyncio.gather(*(g.all_reduce_coalesced(tensors[r]) for r, g in enumerate(groups)),
                                       return_exceptions=True)
        for result in results:
            assert isinstance(result, CollectiveMismatchError), result
            assert "all_reduce_coalesced(sum, float32[5] as 2 tensors, sizes" in str(result)


async def test_a_coalesced_call_with_a_wrong_output_fails_at_once_naming_the_tensor() -> None:
    async with local_world(2) as groups:
        with pytest.raises(InvalidArgumentError, match=r"tensor 1 is float32\[3\].*must be 2 x float32\[2\]"):
            await groups[0].all_gather_into_tensor_coalesced(
                [np.zeros(4, np.float32), np.zeros(3, np.float32)], [np.ones(2, np.float32)] * 2)

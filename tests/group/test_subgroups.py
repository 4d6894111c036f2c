"""Tests for asyncdist.group.subgroups through the await API: ``split`` (MPI's
``MPI_Comm_split``) and ``partition`` on real ranks in one loop, each result
checked against the groups worked out here from the colours and keys, and by
a reduction run inside every new group."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from asyncdist.errors import CollectiveMismatchError, InvalidArgumentError, InvalidRankError
from asyncdist.testing import local_world


def expected_split(colors: list[int | None], keys: list[int]) -> dict[int, list[int]]:
    """MPI_Comm_split by hand: colour -> its ranks, ordered by (key, rank)."""
    groups: dict[int, list[int]] = {}
    for rank, color in enumerate(colors):
        if color is not None:
            groups.setdefault(color, []).append(rank)
    return {c: sorted(members, key=lambda r: (keys[r], r)) for c, members in groups.items()}


@pytest.mark.parametrize(
    ("colors", "keys"),
    [
        ([0, 1, 0, 1, 0], [0, 0, 0, 0, 0]),  # by rank within each colour
        ([3, 3, 3, 3, 3], [4, 3, 2, 1, 0]),  # one group, reversed by key
        ([2, None, 0, 2, 0], [1, 0, 1, 0, 0]),  # rank 1 joins none; ties broken by rank
        ([5, 4, 3, 2, 1], [0, 0, 0, 0, 0]),  # five groups of one
    ],
)
async def test_split_makes_the_groups_mpi_would_and_each_works(colors: list[int | None], keys: list[int]) -> None:
    expected = expected_split(colors, keys)
    async with local_world(5) as ranks:
        groups = await asyncio.gather(*(w.split(colors[r], keys[r]) for r, w in enumerate(ranks)))
        for r, group in enumerate(groups):
            if colors[r] is None:
                assert group is None
                continue
            assert group is not None
            members = expected[colors[r]]
            assert group.ranks == tuple(members) and group.rank == members.index(r)
        # a sum inside each group equals the sum of its members' ranks
        values = {r: np.array([float(r + 1)]) for r, g in enumerate(groups) if g is not None}
        await asyncio.gather(*(groups[r].all_reduce(v) for r, v in values.items()))
        for r, value in values.items():
            assert value.tolist() == [float(sum(m + 1 for m in expected[colors[r]]))]


async def test_split_refuses_a_bad_colour_and_a_group_short_of_the_job() -> None:
    async with local_world(3) as ranks:
        with pytest.raises(InvalidArgumentError, match="color must be a non-negative int or None, got -1"):
            await ranks[0].split(-1)
        pairs = [w.new_group([0, 1]) for w in ranks]
        with pytest.raises(InvalidArgumentError, match="has 2 of the job's 3 ranks"):
            await pairs[0].split(0)


async def test_partition_gives_each_rank_its_group_and_refuses_shared_ranks() -> None:
    async with local_world(4) as ranks:
        made = [w.partition([[3, 1], [0]]) for w in ranks]
        assert [mine.ranks if mine else None for mine, _ in made] == [(0,), (3, 1), None, (3, 1)]
        for _, groups in made:
            assert [g.ranks for g in groups] == [(3, 1), (0,)]
        got = {r: np.array([r * 10]) for r in (1, 3)}
        await asyncio.gather(*(made[r][0].broadcast(got[r], src=0) for r in (1, 3)))
        assert got[1].tolist() == got[3].tolist() == [30]
        with pytest.raises(InvalidArgumentError, match=r"rank 1 appears in both subgroup \[1, 2\] and \[1\]"):
            ranks[0].partition([[1, 2], [1]])
        with pytest.raises(InvalidRankError, match="invalid rank 4 for group"):
            ranks[0].partition([[4]])


@pytest.mark.parametrize(
    "lists",
    [
        [[0, 1], [0, 1, 2], [0, 1, 2]],  # rank 0 leaves rank 2 out; ranks 1 and 2 take it in
        [[0, 1, 2], [0, 2, 1], [0, 1, 2]],  # the same members, in another order on rank 1
        [[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2], [0, 1, 2, 3]],  # rank 2 leaves rank 3 out
    ],
)
async def test_ranks_that_pass_new_group_different_members_all_raise_naming_the_lists(lists: list[list[int]]) -> None:
    """Each rank makes "the same" group from its own list: the group's first
    collective raises CollectiveMismatchError on every rank, never a wrong sum."""
    async with local_world(len(lists), timeout=10.0) as world:
        groups = [g.new_group(members) for g, members in zip(world, lists)]
        tensors = [np.full(1, float(g.rank + 1)) for g in world]
        outcomes = await asyncio.gather(
            *(grp.all_reduce(t) for grp, t in zip(groups, tensors) if grp.rank >= 0), return_exceptions=True
        )
        assert all(isinstance(o, CollectiveMismatchError) for o in outcomes), outcomes
        # Where the lists' messages met, the error names both lists.
        named = " ".join(str(o) for o in outcomes)
        assert any(f"among ranks {members}" in named for members in lists if members != lists[0]), named
        # Made again with one list everywhere, the group works.
        again = [g.new_group(lists[0]) for g in world]
        values = [np.full(1, float(g.rank + 1)) for g in world]
        await asyncio.gather(*(grp.all_reduce(v) for grp, v in zip(again, values) if grp.rank >= 0))
        expected = float(sum(r + 1 for r in lists[0]))
        assert [v[0] for g, v in zip(again, values) if g.rank >= 0] == [expected] * len(lists[0])

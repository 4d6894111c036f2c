"""The facade's ``shrink_group`` and ``split_group``, with torch 2.13's semantics, on rank processes.

``shrink_group``: the default group's shrink makes the new group the default
(``get_rank``/``get_world_size`` follow it) and destroys the other groups;
no ``ranks_to_exclude`` means the ranks known lost; an excluded rank must
not call it; a live rank that is excluded is dropped from the job.
``split_group``: only the parent's members call it, and the other ranks'
groups stay in step.
"""

from __future__ import annotations

import numpy as np
import pytest

from asyncdist.testing import spawn


def shrink_the_default_group() -> dict:
    import asyncdist as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dist.new_group([0, 1, 2])
    if rank == 3:
        dist.destroy_process_group()  # it leaves: the others see it lost
        return {}
    out: dict = {}
    try:
        dist.barrier()
    except dist.DistError as exc:
        out["barrier"] = type(exc).__name__
    out["agreed"] = dist.agree(0b011 if rank else 0b110)  # rank 3 has left: it does not count
    out["failed"] = dist.failed_ranks()
    with pytest.raises(dist.errors.InvalidArgumentError, match="must not take part"):
        dist.shrink_group([rank])
    with pytest.raises(dist.errors.InvalidArgumentError, match="Duplicate rank 3"):
        dist.shrink_group([3, 3])
    with pytest.raises(dist.errors.InvalidArgumentError, match="ranks_to_exclude cannot be empty"):
        dist.shrink_group([])
    new = dist.shrink_group()  # the ranks known lost: rank 3
    out.update(default=new is dist.GroupMember.WORLD, rank=dist.get_rank(), size=dist.get_world_size(),
               ranks=dist.get_process_group_ranks(new), count=dist.get_pg_count())
    x = np.array([float(rank + 1)])
    # Exclude a live rank from a subgroup of the new default group: it is dropped from the job.
    sub = dist.new_group([0, 1, 2])
    if rank == 2:
        try:
            # The first may fail too: ranks 0 and 1 can finish it, shrink and exclude this
            # rank while the last message of its own part is still on its way here.
            dist.all_reduce(x)
            dist.all_reduce(np.ones(1))
        except dist.errors.RankExcludedError as exc:
            out["excluded"] = str(exc)
        return out
    dist.all_reduce(x)
    out.update(sum=x.tolist())
    pair = dist.shrink_group([2], group=sub)
    y = np.array([float(rank)])
    dist.all_reduce(y, group=pair)
    out.update(pair=dist.get_process_group_ranks(pair), pair_sum=y.tolist(), sub_gone=sub not in _groups(dist))
    dist.destroy_process_group()
    return out


def _groups(dist) -> list:
    return list(dist.GroupMember.WORLD.subgroups.groups)


def test_shrink_group_of_the_default_group_and_of_a_subgroup() -> None:
    results = spawn(4, shrink_the_default_group, timeout=90)
    for rank in (0, 1):
        out = results[rank]
        assert out["barrier"] == "PeerLostError"
        assert (out["agreed"], out["failed"]) == (0b010, [3])
        assert (out["default"], out["rank"], out["size"], out["ranks"]) == (True, rank, 3, [0, 1, 2])
        assert out["count"] == 1 and out["sum"] == [6.0]
        assert out["pair"] == [0, 1] and out["pair_sum"] == [1.0] and out["sub_gone"]
    assert results[2]["ranks"] == [0, 1, 2] and results[2]["size"] == 3
    assert results[2]["excluded"].startswith("rank 2 was excluded from the job by rank")


def split_by_the_parent_only() -> dict:
    import asyncdist as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    parent = dist.new_group([1, 2, 3])
    out: dict = {}
    if rank != 0:  # only the parent's members call it, as in torch
        with pytest.raises(dist.errors.InvalidArgumentError, match="split_ranks cannot be None or empty"):
            dist.split_group(parent, [])
        with pytest.raises(dist.errors.InvalidArgumentError, match="appears in split 0 and split 1"):
            dist.split_group(parent, [[0, 1], [1, 2]])
        mine = dist.split_group(parent, [[0], [2, 1]])  # group ranks of the parent: global 1 | global 2, 3
        x = np.array([float(rank)])
        dist.all_reduce(x, group=mine)
        out.update(ranks=dist.get_process_group_ranks(mine), sum=x.tolist())
    else:
        with pytest.raises(dist.errors.InvalidArgumentError, match="not part of the parent group"):
            dist.split_group(parent, [[0]])
    later = dist.new_group([0, 3])  # every rank's next group: still in step
    if rank in (0, 3):
        y = np.ones(1)
        dist.all_reduce(y, group=later)
        out["later"] = y.tolist()
    dist.destroy_process_group()
    return out


def test_split_group_needs_only_the_parents_members() -> None:
    results = spawn(4, split_by_the_parent_only, timeout=60)
    assert results[1] == {"ranks": [1], "sum": [1.0]}
    assert results[2] == {"ranks": [2, 3], "sum": [5.0]}
    assert results[3] == {"ranks": [2, 3], "sum": [5.0], "later": [2.0]}
    assert results[0] == {"later": [2.0]}

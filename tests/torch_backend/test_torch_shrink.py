"""``torch.distributed.shrink_group`` on a ``backend="asyncdist"`` group (torch's own works only on NCCL)."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncdist.errors import RankExcludedError
from asyncdist.testing import spawn

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from test_torch_collectives import init  # noqa: E402  (same directory; torch is needed first)


def shrink_through_torch(path: Path) -> dict:
    rank, _ = init(path)
    t = torch.ones(2)
    if rank == 3:  # excluded: it does not call shrink_group, and is dropped from the job
        try:
            # The first may fail too: the others can finish it, shrink and exclude this
            # rank while the last message of its own part is still on its way here.
            dist.all_reduce(t)
            dist.all_reduce(t)
        except RankExcludedError as exc:
            return {"excluded": str(exc)}
        return {}
    dist.all_reduce(t)
    # A live rank is expelled as soon as the first survivor starts the shrink:
    # every survivor's calls that need it must be complete by then (rank 1's
    # all_reduce waits for rank 3's part), so the survivors meet first.
    store = dist.distributed_c10d._get_default_store()
    store.set(f"reduced/{rank}", "1")
    store.wait([f"reduced/{r}" for r in range(3)])
    new = dist.shrink_group([3])
    t = torch.full((2,), float(rank + 1))
    dist.all_reduce(t)
    out = {"default": new == dist.group.WORLD, "rank": dist.get_rank(), "size": dist.get_world_size(),
           "ranks": dist.get_process_group_ranks(new), "sum": t.tolist(), "desc": new.group_desc}
    dist.destroy_process_group()
    return out


def test_torch_shrink_group_works_on_an_asyncdist_group(tmp_path: Path) -> None:
    results = spawn(4, shrink_through_torch, tmp_path / "store", timeout=90)
    for rank in range(3):
        assert results[rank] == {"default": True, "rank": rank, "size": 3, "ranks": [0, 1, 2],
                                 "sum": [6.0, 6.0], "desc": "default:shrunken"}
    assert results[3]["excluded"].startswith("rank 3 was excluded from the job by rank ")

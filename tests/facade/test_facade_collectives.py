"""The blocking facade's collectives, groups, object collectives and batches, on 4 rank processes.

Every rank derives its inputs from its rank number (``_ints``, ``_floats``,
``_obj``), so the test recomputes every rank's inputs and checks the results
against a NumPy reference. Several operations share one rank function to keep
process starts few.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import numpy as np
import pytest

import asyncdist as dist
from asyncdist.errors import InvalidArgumentError, OperationTimeoutError
from asyncdist.testing import spawn

torch = pytest.importorskip("torch")

N = 4


def _ints(rank: int, n: int = 6) -> np.ndarray:
    return np.random.default_rng([7, rank]).integers(-4, 5, n)


def _floats(rank: int, n: int = 5) -> np.ndarray:
    return np.random.default_rng([8, rank]).standard_normal(n)


@dataclass
class Payload:
    """A non-trivial picklable object; its pickled size grows with ``i``."""

    name: str
    values: list
    extra: dict = field(default_factory=dict)


def _obj(i: int) -> Payload:
    return Payload(f"rank-{i}" * (i + 1), list(range(i, 2 * i + 2)), {"set": frozenset({i, -i}), "pair": (i, str(i))})


# -- rank bodies (module level: they run in the rank processes) --------------


def tensor_collectives() -> dict:
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    out: dict = {}

    t = torch.from_numpy(_floats(rank)).float()
    assert dist.broadcast(t, src=2) is None
    out["broadcast"] = t.numpy().copy()
    a = _ints(rank)
    dist.broadcast(a, group_src=1)
    out["broadcast_np"] = a

    t = torch.from_numpy(_ints(rank))
    dist.all_reduce(t)
    out["all_reduce_sum"] = t.numpy().copy()
    a = _floats(rank)
    dist.all_reduce(a, op=dist.ReduceOp.MAX)
    out["all_reduce_max"] = a
    t = torch.from_numpy(_floats(rank))
    work = dist.all_reduce(t, op=dist.ReduceOp.AVG, async_op=True)
    assert isinstance(work, dist.Work) and work.wait() is True and work.is_completed()
    assert work.result()[0] is t
    out["all_reduce_avg"] = t.numpy().copy()
    pair = [torch.from_numpy(_ints(rank)), _floats(rank)]
    dist.all_reduce_coalesced(pair, op=dist.ReduceOp.MIN)
    out["coalesced"] = [pair[0].numpy().copy(), pair[1]]

    a = _ints(rank)
    dist.reduce(a, dst=3, op=dist.ReduceOp.PRODUCT)
    out["reduce"] = a

    slots = [torch.empty(6, dtype=torch.int64) for _ in range(size)]
    dist.all_gather(slots, torch.from_numpy(_ints(rank)))
    out["all_gather"] = np.stack([s.numpy() for s in slots])
    stacked = np.empty((size, 5))
    dist.all_gather_into_tensor(stacked, _floats(rank))
    out["all_gather_into_tensor"] = stacked
    flat = torch.empty(size * 6, dtype=torch.int64)
    dist.all_gather_single(flat, torch.from_numpy(_ints(rank)), async_op=True).wait()
    out["all_gather_single"] = flat.numpy().copy()

    gathered = [np.empty(6, np.int64) for _ in range(size)] if rank == 0 else None
    dist.gather(_ints(rank), gathered)  # dst defaults to rank 0
    out["gather"] = np.stack(gathered) if gathered else None
    pieces = [torch.full((3,), 10.0 * i) for i in range(size)] if rank == 2 else None
    mine = torch.empty(3)
    dist.scatter(mine, pieces, src=2)
    out["scatter"] = mine.numpy().copy()

    got = torch.empty(6, dtype=torch.int64)
    dist.reduce_scatter(got, [torch.from_numpy(_ints(rank) * (i + 1)) for i in range(size)])
    out["reduce_scatter"] = got.numpy().copy()
    got = np.empty(6, np.int64)
    dist.reduce_scatter_tensor(got, np.concatenate([_ints(rank) + 100 * i for i in range(size)]))
    out["reduce_scatter_tensor"] = got
    got = torch.empty(5, dtype=torch.float64)
    dist.reduce_scatter_single(got, torch.from_numpy(np.stack([_floats(rank) * i for i in range(size)])), op=dist.ReduceOp.MAX)
    out["reduce_scatter_single"] = got.numpy().copy()

    # all_to_all with uneven sizes: rank r sends j + 1 values 100r + j to rank j.
    outputs = [torch.empty(rank + 1, dtype=torch.int32) for _ in range(size)]
    dist.all_to_all(outputs, [torch.full((j + 1,), 100 * rank + j, dtype=torch.int32) for j in range(size)])
    out["all_to_all"] = [o.tolist() for o in outputs]
    rows = np.arange(2 * sum(range(1, size + 1)), dtype=np.float32).reshape(-1, 2) + 1000 * rank
    received = np.empty((size * (rank + 1), 2), np.float32)
    dist.all_to_all_single(received, rows, [rank + 1] * size, [j + 1 for j in range(size)])
    out["all_to_all_single"] = received

    dist.barrier()
    dist.barrier(async_op=True).wait()
    dist.barrier(timeout=timedelta(seconds=20))
    return out


def groups_and_objects() -> dict:
    dist.init_process_group()
    rank, size = dist.get_rank(), dist.get_world_size()
    out: dict = {"world_is_default": dist.GroupMember.WORLD is not None}

    pair = dist.new_group([1, 0])
    t = torch.full((2,), float(rank + 1))
    out["pair"] = (pair == dist.GroupMember.NON_GROUP_MEMBER, dist.all_reduce(t, group=pair), t.tolist())
    out["pair_rank"] = (dist.get_rank(pair), dist.get_world_size(pair))
    if pair != dist.GroupMember.NON_GROUP_MEMBER:
        out["pair_ranks"] = (dist.get_process_group_ranks(pair), dist.get_group_rank(pair, 1), dist.get_global_rank(pair, 0))
    else:  # every call on a group this rank is not in returns None and touches nothing
        x = torch.full((2,), -1.0)
        out["non_member"] = [
            dist.broadcast(x, src=0, group=pair),
            dist.reduce(x, dst=0, group=pair),
            dist.barrier(group=pair),
            dist.all_gather_object([None, None], "x", group=pair),
            dist.batch_isend_irecv([dist.P2POp(dist.isend, x, 0, group=pair)]),
            x.tolist(),
        ]
        dist.destroy_process_group(pair)  # a no-op, as in torch

    # Group ranks follow the given order with sort_ranks=False: group rank 0 is global rank 3.
    back = dist.new_group([3, 1], sort_ranks=False)
    b = np.full(3, float(rank))
    dist.broadcast(b, src=3, group=back)
    c = np.full(3, float(rank))
    dist.broadcast(c, group_src=1, group=back)
    out["back"] = (b.tolist(), c.tolist(), dist.get_rank(back))

    cur, subs = dist.new_subgroups(group_size=2)
    s = torch.tensor([rank * 10])
    dist.all_reduce(s, group=cur)
    out["subgroups"] = (dist.get_process_group_ranks(cur), s.item(), [g == dist.GroupMember.NON_GROUP_MEMBER for g in subs])
    cur2, _ = dist.new_subgroups_by_enumeration([[0, 2], [1, 3]])
    m = torch.tensor([rank])
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=cur2)
    kept = len(dist.GroupMember.WORLD.subgroups.groups)
    dist.destroy_process_group(cur2)
    out["enumeration"] = (m.item(), kept - len(dist.GroupMember.WORLD.subgroups.groups))

    objs = [_obj(7), {"array": np.arange(4), "tensor": torch.tensor([1.5, 2.5])}, None] if rank == 2 else [0, 0, 0]
    dist.broadcast_object_list(objs, src=2)
    out["broadcast_object_list"] = (objs[0], objs[1]["array"].tolist(), objs[1]["tensor"].tolist(), objs[2])
    everyone = [None] * size
    dist.all_gather_object(everyone, _obj(rank))
    out["all_gather_object"] = everyone
    at_three = [None] * size if rank == 3 else None
    dist.gather_object(_obj(rank + 10), at_three, dst=3)
    out["gather_object"] = at_three
    slot = [None]
    dist.scatter_object_list(slot, [_obj(20 + i) for i in range(size)] if rank == 1 else None, src=1)
    out["scatter_object_list"] = slot[0]
    if rank == 0:
        dist.send_object_list([_obj(30), "thirty"], dst=3)
    elif rank == 3:
        box = [None, None]
        out["recv_object_list"] = (dist.recv_object_list(box), box)  # from any rank
    dist.barrier()  # before the ring's sends, which that any-source receive would also match

    sent = torch.arange(3) + 10 * rank
    got = torch.zeros(3, dtype=torch.int64)
    right, left = (rank + 1) % size, (rank - 1) % size
    # torch's irecv is accepted too: ops are recognised by name.
    ops = [dist.P2POp(torch.distributed.irecv, got, left), dist.P2POp(dist.isend, sent, right)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    out["batch_ring"] = got.tolist()

    dist.monitored_barrier(timeout=timedelta(seconds=20), wait_all_ranks=True)
    return out


def rank_three_skips_the_monitored_barrier() -> str:
    dist.init_process_group()
    rank = dist.get_rank()
    if rank == 3:
        dist.recv(torch.zeros(1), src=0)  # stay connected until rank 0 has given up
        try:  # late: the verdict is already here, so this fails at once
            dist.monitored_barrier(timeout=timedelta(seconds=20))
        except OperationTimeoutError as exc:
            return str(exc)
        return "no error"
    try:
        dist.monitored_barrier(timeout=timedelta(seconds=1))
    except OperationTimeoutError as exc:
        return str(exc)
    finally:
        if rank == 0:
            dist.send(torch.zeros(1), dst=3)
    return "no error"


def two_ranks_skip_each_monitored_barrier() -> list[str]:
    """Two rounds: ranks 2 and 3 skip the first (rank 0 waits for all), ranks
    1 and 3 the second (rank 0 stops at the first). A skipping rank enters
    once rank 0 has given up, and reads the verdict at once."""
    dist.init_process_group()
    rank = dist.get_rank()
    messages = []
    for skipping, wait_all_ranks in (((2, 3), True), ((1, 3), False)):
        if rank in skipping:
            dist.recv(torch.zeros(1), src=0)  # until rank 0 has given up
        try:
            dist.monitored_barrier(timeout=timedelta(seconds=1), wait_all_ranks=wait_all_ranks)
            messages.append("no error")
        except OperationTimeoutError as exc:
            messages.append(str(exc))
        finally:
            if rank == 0:
                for late in skipping:
                    dist.send(torch.zeros(1), dst=late)
    return messages


def rank_one_skips_a_barrier_with_a_timeout() -> str:
    dist.init_process_group()
    if dist.get_rank() == 1:
        got = torch.zeros(1)
        dist.recv(got, src=0)  # only once rank 0 has given up
        return f"released with {got.item()}"
    try:
        dist.barrier(timeout=0.5)
    except OperationTimeoutError as exc:
        return str(exc)
    finally:
        dist.send(torch.full((1,), 7.0), dst=1)
    return "no error"


# -- tests -----------------------------------------------------------------------


def test_every_tensor_collective_matches_numpy() -> None:
    results = spawn(N, tensor_collectives)
    ints = np.stack([_ints(r) for r in range(N)])
    floats = np.stack([_floats(r) for r in range(N)])
    for rank, out in enumerate(results):
        np.testing.assert_array_equal(out["broadcast"], floats[2].astype(np.float32))
        np.testing.assert_array_equal(out["broadcast_np"], ints[1])
        np.testing.assert_array_equal(out["all_reduce_sum"], ints.sum(0))
        np.testing.assert_array_equal(out["all_reduce_max"], floats.max(0))
        np.testing.assert_allclose(out["all_reduce_avg"], floats.mean(0), rtol=1e-12)
        np.testing.assert_array_equal(out["coalesced"][0], ints.min(0))
        np.testing.assert_array_equal(out["coalesced"][1], floats.min(0))
        np.testing.assert_array_equal(out["reduce"], ints.prod(0) if rank == 3 else ints[rank])
        np.testing.assert_array_equal(out["all_gather"], ints)
        np.testing.assert_array_equal(out["all_gather_into_tensor"], floats)
        np.testing.assert_array_equal(out["all_gather_single"], ints.ravel())
        if rank == 0:
            np.testing.assert_array_equal(out["gather"], ints)
        else:
            assert out["gather"] is None
        np.testing.assert_array_equal(out["scatter"], np.full(3, 10.0 * rank))
        np.testing.assert_array_equal(out["reduce_scatter"], ints.sum(0) * (rank + 1))
        np.testing.assert_array_equal(out["reduce_scatter_tensor"], ints.sum(0) + N * 100 * rank)
        np.testing.assert_array_equal(out["reduce_scatter_single"], (floats * rank).max(0))
        assert out["all_to_all"] == [[100 * i + rank] * (rank + 1) for i in range(N)]
        # Rank i's rows for this rank start after the j + 1 rows it sent each lower rank j.
        start = sum(range(1, rank + 1))
        expected = [np.arange(2 * start, 2 * (start + rank + 1), dtype=np.float32).reshape(-1, 2) + 1000 * i for i in range(N)]
        np.testing.assert_array_equal(out["all_to_all_single"], np.concatenate(expected))


def test_groups_objects_batches_and_monitored_barrier() -> None:
    results = spawn(N, groups_and_objects)
    for rank, out in enumerate(results):
        assert out["world_is_default"]
        if rank < 2:
            assert out["pair"] == (False, None, [3.0, 3.0])
            assert out["pair_rank"] == (rank, 2)
            assert out["pair_ranks"] == ([0, 1], 1, 0)
        else:
            assert out["pair"] == (True, None, [float(rank + 1)] * 2)  # untouched
            assert out["pair_rank"] == (-1, -1)
            assert out["non_member"] == [None, None, None, None, [], [-1.0, -1.0]]
        if rank in (1, 3):
            assert out["back"] == ([3.0] * 3, [1.0] * 3, {3: 0, 1: 1}[rank])
        else:
            assert out["back"] == ([float(rank)] * 3, [float(rank)] * 3, -1)
        mates = [0, 1] if rank < 2 else [2, 3]
        assert out["subgroups"] == (mates, sum(10 * r for r in mates), [rank >= 2, rank < 2])
        assert out["enumeration"] == (rank + 2 if rank < 2 else rank, 1)
        assert out["broadcast_object_list"] == (_obj(7), [0, 1, 2, 3], [1.5, 2.5], None)
        assert out["all_gather_object"] == [_obj(r) for r in range(N)]
        assert out["gather_object"] == ([_obj(r + 10) for r in range(N)] if rank == 3 else None)
        assert out["scatter_object_list"] == _obj(20 + rank)
        if rank == 3:
            assert out["recv_object_list"] == (0, [_obj(30), "thirty"])
        assert out["batch_ring"] == [10 * ((rank - 1) % N) + i for i in range(3)]


def test_monitored_barrier_honours_wait_all_ranks() -> None:
    results = spawn(N, two_ranks_skip_each_monitored_barrier, timeout=60)
    every, first = results[0]
    # gloo's semantics: wait_all_ranks names every rank that did not come, else the first
    assert every.startswith("rank 0: monitored_barrier of group 'world': ranks 2, 3 failed to pass it within 1 s")
    assert first.startswith("rank 0: monitored_barrier of group 'world': rank 1 failed to pass it within 1 s")
    for rank in (1, 2, 3):
        assert "group rank 0 reports that ranks 2, 3 failed to pass it" in results[rank][0], results[rank]
        assert "group rank 0 reports that rank 1 failed to pass it" in results[rank][1], results[rank]


def test_monitored_barrier_names_the_rank_that_never_came() -> None:
    results = spawn(N, rank_three_skips_the_monitored_barrier, timeout=60)
    assert results[0].startswith("rank 0: monitored_barrier of group 'world': rank 3 failed to pass it within 1 s")
    for message in results[1:3]:
        assert "group rank 0 reports that rank 3 failed to pass it" in message
    assert results[3].startswith("rank 3: ") and "reports that rank 3 failed" in results[3]


def test_a_barrier_times_out_after_its_own_timeout_argument() -> None:
    results = spawn(2, rank_one_skips_a_barrier_with_a_timeout, timeout=60)
    assert results == ["barrier of group 'world' Timed out after 0.5 s (its timeout argument)", "released with 7.0"]


def test_blocking_calls_need_an_initialized_group_and_sane_arguments() -> None:
    with pytest.raises(ValueError, match="has not been initialized"):
        dist.all_reduce(np.zeros(1))
    with pytest.raises(InvalidArgumentError, match="isend or irecv"):
        dist.P2POp(dist.send, np.zeros(1), 0)
    assert dist.GroupMember.WORLD is None and dist.GroupMember.NON_GROUP_MEMBER == -100


def test_launcher_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert dist.get_node_local_rank(fallback_rank=5) == 5 and not dist.is_torchelastic_launched()
    with pytest.raises(RuntimeError, match="LOCAL_RANK"):
        dist.get_node_local_rank()
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    assert dist.get_node_local_rank(fallback_rank=5) == 3 and dist.is_torchelastic_launched()

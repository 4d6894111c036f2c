"""Every torch.distributed collective and send/recv on backend="asyncdist",
with real rank processes, against a NumPy reference.

One process start per world size runs every call (starting ranks with torch
is the expensive part): each rank returns what it received and the test
computes what it should have been from the same inputs.
"""

from __future__ import annotations

import os
import warnings
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from asyncdist.testing import spawn

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

BIG = 40_000  # float32 elements: 160 KB, past the 64 KiB switch to the ring algorithms


def init(path: Path, seconds: float = 60) -> tuple[int, int]:
    """Join the test's job with torch's own init_process_group over a FileStore."""
    import asyncdist.torch_backend  # noqa: F401  (registers "asyncdist" in the rank process)

    torch.set_num_threads(1)
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("asyncdist", init_method=f"file://{path}", rank=rank, world_size=size,
                            timeout=timedelta(seconds=seconds))
    return rank, size


def data(rank: int, size: int) -> dict[str, np.ndarray]:
    """Rank ``rank``'s inputs, the same in the rank and in the reference."""
    rng = np.random.default_rng(100 + rank)
    return {
        "f32": rng.standard_normal(7).astype(np.float32),
        "f64": rng.standard_normal(3),
        "i64": rng.integers(-50, 50, 5),
        "big": rng.standard_normal(BIG).astype(np.float32),
        "rows": rng.standard_normal((2 * size, 3)).astype(np.float32),  # 2 rows per rank
        "uneven": np.arange(sum(range(1, size + 1)), dtype=np.float64) + 100 * rank,  # rank j gets j+1 rows
    }


def t(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(array.copy())


def every_collective(path: Path) -> dict:
    rank, size = init(path)
    x = data(rank, size)
    got: dict = {}
    for name, op in [("sum", dist.ReduceOp.SUM), ("max", dist.ReduceOp.MAX), ("min", dist.ReduceOp.MIN),
                     ("product", dist.ReduceOp.PRODUCT), ("avg", dist.ReduceOp.AVG)]:
        tensor = t(x["f64"])
        dist.all_reduce(tensor, op=op)
        got[f"all_reduce_{name}"] = tensor.numpy()
    ints, big = t(x["i64"]), t(x["big"])
    work = dist.all_reduce(big, async_op=True)  # two calls in flight at once
    dist.all_reduce(ints, op=dist.ReduceOp.MAX)
    assert work.wait(timedelta(seconds=30)) and work.is_completed()
    got["all_reduce_i64_max"], got["all_reduce_big"] = ints.numpy(), big.numpy()
    bits = torch.tensor([1 << rank, 3 + rank])
    dist.all_reduce(bits, op=dist.ReduceOp.BOR)
    got["all_reduce_bor"] = bits.tolist()
    halves = torch.full((3,), 0.5 * (rank + 1), dtype=torch.bfloat16)
    dist.all_reduce(halves)
    got["all_reduce_bf16"] = halves.float().tolist()
    a, b = t(x["f32"]), t(x["big"][:5])  # torch wants one dtype
    dist.all_reduce_coalesced([a, b])
    got["all_reduce_coalesced"] = [a.numpy(), b.numpy()]

    tensor = t(x["f32"])
    dist.broadcast(tensor, src=size - 1)
    got["broadcast"] = tensor.numpy()
    tensor = t(x["f64"])
    dist.reduce(tensor, dst=1 % size)
    got["reduce_sum"] = tensor.numpy()

    slots = [torch.zeros(7) for _ in range(size)]
    dist.all_gather(slots, t(x["f32"]))
    got["all_gather"] = np.stack([s.numpy() for s in slots])
    whole = torch.zeros(2 * size * size, 3)
    dist.all_gather_single(whole, t(x["rows"]))
    got["all_gather_single"] = whole.numpy()
    gathered = [torch.zeros(3, dtype=torch.float64) for _ in range(size)] if rank == 0 else None
    dist.gather(t(x["f64"]), gathered, dst=0)
    got["gather"] = np.stack([g.numpy() for g in gathered]) if rank == 0 else None
    tensor = torch.zeros(2, 3)
    dist.scatter(tensor, list(t(x["rows"]).chunk(size)) if rank == size - 1 else None, src=size - 1)
    got["scatter"] = tensor.numpy()

    tensor = torch.zeros(2, 3)
    dist.reduce_scatter(tensor, list(t(x["rows"]).chunk(size)))
    got["reduce_scatter"] = tensor.numpy()
    tensor = torch.zeros(2, 3)
    dist.reduce_scatter_single(tensor, t(x["rows"]), op=dist.ReduceOp.MAX)
    got["reduce_scatter_single_max"] = tensor.numpy()

    with dist._coalescing_manager(async_ops=True) as manager:  # the *_coalesced paths, as FSDP uses them
        gathers = [torch.zeros(2 * size, 3), torch.zeros(size * 7)]
        dist.all_gather_single(gathers[0], t(x["rows"][:2]))
        dist.all_gather_single(gathers[1], t(x["f32"]))
    manager.wait()
    got["all_gather_coalesced"] = [g.numpy() for g in gathers]
    with dist._coalescing_manager(async_ops=True) as manager:
        parts = [torch.zeros(2, 3), torch.zeros(2)]
        dist.reduce_scatter_tensor(parts[0], t(x["rows"]))
        dist.reduce_scatter_tensor(parts[1], t(x["rows"][:, 0]))
    manager.wait()
    got["reduce_scatter_coalesced"] = [p.numpy() for p in parts]
    lists = [[torch.zeros(2), torch.zeros(1)] for _ in range(size)]  # output_lists[r][i]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch deprecates it, and still serves it
        dist.all_gather_coalesced(lists, [torch.full((2,), float(rank)), torch.tensor([10.0 + rank])])
    got["all_gather_coalesced_lists"] = [[t.tolist() for t in per_rank] for per_rank in lists]

    outputs = [torch.zeros(rank + 1, dtype=torch.float64) for _ in range(size)]  # rank j sends me rank+1 values
    inputs = [torch.full((j + 1,), float(10 * rank + j), dtype=torch.float64) for j in range(size)]
    dist.all_to_all(outputs, inputs)
    got["all_to_all"] = [o.numpy() for o in outputs]
    out = torch.zeros(2 * size, 3)
    dist.all_to_all_single(out, t(x["rows"]))
    got["all_to_all_single"] = out.numpy()
    out = torch.zeros(size * (rank + 1), dtype=torch.float64)
    dist.all_to_all_single(out, t(x["uneven"]), output_split_sizes=[rank + 1] * size,
                           input_split_sizes=list(range(1, size + 1)))
    got["all_to_all_single_uneven"] = out.numpy()

    dist.barrier()
    objects = [None] * size
    dist.all_gather_object(objects, {"rank": rank, "name": f"r{rank}"})
    got["all_gather_object"] = objects
    got.update(point_to_point(rank, size))
    got.update(subgroups(rank, size))
    got.update(functional_and_dtensor(rank, size))
    dist.destroy_process_group()
    return got


def functional_and_dtensor(rank: int, size: int) -> dict:
    """torch's functional collectives and DTensor, which resolve the group by name."""
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    summed = funcol.all_reduce(torch.full((2,), float(rank + 1)), "sum", dist.group.WORLD)
    sharded = distribute_tensor(torch.arange(4.0 * size), init_device_mesh("cpu", (size,)), [Shard(0)])
    return {"funcol_sum": summed.tolist(), "dtensor_local": sharded.to_local().tolist(),
            "dtensor_full": sharded.full_tensor().tolist()}


def point_to_point(rank: int, size: int) -> dict:
    got: dict = {}
    ring = torch.zeros(4, dtype=torch.int64)
    send = dist.isend(torch.full((4,), rank, dtype=torch.int64), dst=(rank + 1) % size, tag=7)
    dist.recv(ring, src=(rank - 1) % size, tag=7)
    send.wait()
    got["ring"] = ring.tolist()
    if rank == 0:  # from any source: whoever comes first, each once (own tag: the ring below uses 0)
        senders = []
        for _ in range(size - 1):
            buf = torch.zeros(2)
            sender = dist.recv(buf, tag=3)
            senders.append((sender, buf.tolist()))
        got["any_source"] = sorted(senders)
    else:
        dist.send(torch.full((2,), float(rank)), dst=0, tag=3)
    buf = torch.zeros(3)
    ops = [dist.P2POp(dist.isend, torch.full((3,), float(rank)), (rank + 1) % size),
           dist.P2POp(dist.irecv, buf, (rank - 1) % size)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    got["batch_ring"] = buf.tolist()
    return got


def subgroups(rank: int, size: int) -> dict:
    """torch's new_group: every rank creates every group, members use theirs."""
    evens = dist.new_group(list(range(0, size, 2)))
    odds = dist.new_group(list(range(1, size, 2)))
    mine = evens if rank % 2 == 0 else odds
    tensor = torch.tensor([float(rank)])
    dist.all_reduce(tensor, group=mine)
    first = dist.get_process_group_ranks(mine)[0]
    token = torch.tensor([float(rank)])
    dist.broadcast(token, group=mine, group_src=0)
    return {"subgroup_sum": tensor.item(), "subgroup_bcast": token.item(), "subgroup_first": first,
            "subgroup_backend": dist.get_backend(mine), "subgroup_size": dist.get_world_size(mine)}


def reference(size: int) -> dict:
    x = [data(r, size) for r in range(size)]

    def stack(key: str) -> np.ndarray:
        return np.stack([xr[key] for xr in x])

    rows = stack("rows")  # [rank, 2*size, 3]
    uneven = stack("uneven")
    starts = np.cumsum([0] + list(range(1, size + 1)))
    return {
        "all_reduce_sum": stack("f64").sum(0), "all_reduce_max": stack("f64").max(0),
        "all_reduce_min": stack("f64").min(0), "all_reduce_product": stack("f64").prod(0),
        "all_reduce_avg": stack("f64").sum(0) / size, "all_reduce_i64_max": stack("i64").max(0),
        "all_reduce_big": stack("big").sum(0), "all_reduce_coalesced": [stack("f32").sum(0), stack("big")[:, :5].sum(0)],
        "broadcast": x[-1]["f32"], "all_gather": stack("f32"), "all_gather_single": rows.reshape(-1, 3),
        "gather": stack("f64"), "reduce_scatter_of": lambda r: rows.sum(0)[2 * r:2 * r + 2],
        "reduce_scatter_single_max_of": lambda r: rows.max(0)[2 * r:2 * r + 2],
        "scatter_of": lambda r: x[-1]["rows"][2 * r:2 * r + 2],
        "all_gather_coalesced": [rows[:, :2].reshape(-1, 3), stack("f32").reshape(-1)],
        "reduce_scatter_coalesced_of": lambda r: [rows.sum(0)[2 * r:2 * r + 2], rows.sum(0)[2 * r:2 * r + 2, 0]],
        "all_to_all_single_of": lambda r: rows[:, 2 * r:2 * r + 2].reshape(-1, 3),
        "all_to_all_single_uneven_of": lambda r: np.concatenate([u[starts[r]:starts[r + 1]] for u in uneven]),
        "reduce_sum": stack("f64").sum(0),
    }


@pytest.mark.parametrize("size", [2, 4])
def test_every_collective_matches_numpy(tmp_path: Path, size: int) -> None:
    results = spawn(size, every_collective, tmp_path / "store", timeout=90)
    want = reference(size)
    for rank, got in enumerate(results):
        for key in ("all_reduce_sum", "all_reduce_max", "all_reduce_min", "all_reduce_product", "all_reduce_avg",
                    "all_reduce_i64_max", "broadcast", "all_gather", "all_gather_single"):
            np.testing.assert_allclose(got[key], want[key], rtol=1e-6, err_msg=f"{key} on rank {rank}")
        np.testing.assert_allclose(got["all_reduce_big"], want["all_reduce_big"], rtol=1e-5, atol=1e-5)
        assert got["all_reduce_bor"] == [(1 << size) - 1, np.bitwise_or.reduce(np.arange(3, 3 + size))]
        assert got["all_reduce_bf16"] == [0.25 * size * (size + 1)] * 3
        for g, w in zip(got["all_reduce_coalesced"], want["all_reduce_coalesced"]):
            np.testing.assert_allclose(g, w, rtol=1e-6)
        for g, w in zip(got["all_gather_coalesced"], want["all_gather_coalesced"]):
            np.testing.assert_array_equal(g, w)
        for g, w in zip(got["reduce_scatter_coalesced"], want["reduce_scatter_coalesced_of"](rank), strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-6)
        assert got["all_gather_coalesced_lists"] == [[[float(r)] * 2, [10.0 + r]] for r in range(size)]
        if rank == 1 % size:
            np.testing.assert_allclose(got["reduce_sum"], want["reduce_sum"], rtol=1e-12)
        if rank == 0:
            np.testing.assert_array_equal(got["gather"], want["gather"])
        np.testing.assert_array_equal(got["scatter"], want["scatter_of"](rank))
        np.testing.assert_allclose(got["reduce_scatter"], want["reduce_scatter_of"](rank), rtol=1e-6)
        np.testing.assert_array_equal(got["reduce_scatter_single_max"], want["reduce_scatter_single_max_of"](rank))
        assert [o.tolist() for o in got["all_to_all"]] == [[10.0 * j + rank] * (rank + 1) for j in range(size)]
        np.testing.assert_array_equal(got["all_to_all_single"], want["all_to_all_single_of"](rank))
        np.testing.assert_array_equal(got["all_to_all_single_uneven"], want["all_to_all_single_uneven_of"](rank))
        assert got["all_gather_object"] == [{"rank": r, "name": f"r{r}"} for r in range(size)]
        assert got["ring"] == [(rank - 1) % size] * 4 and got["batch_ring"] == [float((rank - 1) % size)] * 3
        if rank == 0:
            assert got["any_source"] == [(r, [float(r)] * 2) for r in range(1, size)]
        assert got["funcol_sum"] == [size * (size + 1) / 2] * 2
        assert got["dtensor_local"] == [4.0 * rank + i for i in range(4)]
        assert got["dtensor_full"] == [float(i) for i in range(4 * size)]
        members = range(rank % 2, size, 2)
        assert got["subgroup_sum"] == sum(members) and got["subgroup_bcast"] == rank % 2
        assert (got["subgroup_first"], got["subgroup_backend"], got["subgroup_size"]) == (rank % 2, "asyncdist",
                                                                                          len(members))


def _mixed_backend_string(path: Path) -> tuple[str, list[float]]:
    """torch's per-device backend string with asyncdist for the CPU."""
    import asyncdist.torch_backend  # noqa: F401

    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("cpu:asyncdist", init_method=f"file://{path}", rank=rank, world_size=size,
                            timeout=timedelta(seconds=60))
    tensor = torch.arange(3, dtype=torch.float32) + 10 * rank
    dist.all_reduce(tensor)
    backend = str(dist.get_backend())
    dist.destroy_process_group()
    return backend, tensor.tolist()


def test_cpu_asyncdist_in_a_backend_string(tmp_path: Path) -> None:
    results = spawn(2, _mixed_backend_string, tmp_path / "store", timeout=90)
    expected = (np.arange(3) * 2 + 10.0).tolist()
    assert [values for _, values in results] == [expected, expected]
    assert all("asyncdist" in backend for backend, _ in results), results

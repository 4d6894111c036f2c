"""all_reduce of sparse COO tensors on backend="asyncdist": gloo's results, bitwise,
in place; only SUM; sizes that differ between ranks fail on every rank."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pytest

from asyncdist.testing import spawn

torch = pytest.importorskip("torch")

SIZE = (6, 5)


def _coo(indices: object, values: object, size: tuple) -> object:
    return torch.sparse_coo_tensor(indices, values, size, check_invariants=True)


def _inputs(rank: int) -> dict[str, object]:
    """Per case, this rank's sparse tensor: patterns that differ and overlap, an empty one,
    an uncoalesced one, a hybrid one (dense values of shape (3,))."""
    g = torch.Generator().manual_seed(rank)
    n = (7, 3)[rank]
    overlap = _coo(torch.randint(0, 5, (2, n), generator=g), torch.randn(n, generator=g), SIZE)
    empty_here = _coo(torch.zeros(2, 0, dtype=torch.long), torch.zeros(0), SIZE) if rank == 1 \
        else overlap.clone()
    hybrid = _coo(torch.tensor([[rank, 2, 2]]), torch.randn(3, 3, generator=g), (4, 3))
    ints = _coo(torch.tensor([[rank, 1, 1]]), torch.tensor([1, 2, 3]), (3,))
    return {"overlap": overlap, "empty_here": empty_here, "hybrid": hybrid, "ints": ints}


def _sum_all(backend: str, path: Path, rank: int) -> dict:
    import torch.distributed as tdist

    tdist.init_process_group(backend, init_method=f"file://{path}", rank=rank, world_size=2,
                             timeout=timedelta(seconds=60))
    found = {}
    for case, tensor in _inputs(rank).items():
        work = tdist.all_reduce(tensor, async_op=True)
        dense = torch.ones(4)
        tdist.all_reduce(dense, async_op=True).wait()  # started before the sparse one completes
        work.wait()
        assert work.result()[0] is tensor  # in place, as gloo's
        assert torch.equal(dense, torch.full((4,), 2.0))
        found[case] = (tensor.is_coalesced(), tensor._indices().clone(), tensor._values().clone())
    try:
        tdist.all_reduce(_inputs(rank)["overlap"], op=tdist.ReduceOp.MAX)
    except RuntimeError as exc:  # gloo's RuntimeError; asyncdist's InvalidArgumentError is one
        found["max"] = type(exc).__name__
    tdist.destroy_process_group()
    return found


def sparse_on_both(tmp: Path) -> dict:
    import asyncdist.torch_backend  # noqa: F401  (registers "asyncdist")

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    return {backend: _sum_all(backend, tmp / backend, rank) for backend in ("gloo", "asyncdist")}


def test_sparse_all_reduce_is_gloos_bitwise_and_in_place(tmp_path: Path) -> None:
    results = spawn(2, sparse_on_both, tmp_path)
    inputs = [_inputs(rank) for rank in range(2)]
    for rank, found in enumerate(results):
        assert found["asyncdist"]["max"] == "InvalidArgumentError" and found["gloo"]["max"] == "RuntimeError"
        for case in inputs[0]:
            coalesced, indices, values = found["asyncdist"][case]
            _, gloo_indices, gloo_values = found["gloo"][case]
            assert coalesced, (rank, case)
            assert torch.equal(indices, gloo_indices) and torch.equal(values, gloo_values), (rank, case)
            # Independent of gloo: the dense sum of the two ranks' inputs.
            expected = inputs[0][case].to_dense() + inputs[1][case].to_dense()  # type: ignore[attr-defined]
            got = _coo(indices, values, expected.shape).to_dense()
            torch.testing.assert_close(got, expected)


def mismatched_sizes(tmp: Path) -> tuple[str, list[float]]:
    import torch.distributed as tdist

    import asyncdist.torch_backend  # noqa: F401

    rank = int(os.environ["RANK"])
    tdist.init_process_group("asyncdist", init_method=f"file://{tmp / 'store'}", rank=rank, world_size=2,
                             timeout=timedelta(seconds=60))
    tensor = _coo(torch.tensor([[0]]), torch.tensor([1.0]), (3 + rank,))
    try:
        tdist.all_reduce(tensor)
        error = "none"
    except RuntimeError as exc:
        error = f"{type(exc).__name__}: {exc}"
    after = torch.ones(2)
    tdist.all_reduce(after)  # the group goes on
    tdist.destroy_process_group()
    return error, after.tolist()


def test_sparse_sizes_that_differ_fail_on_every_rank(tmp_path: Path) -> None:
    for rank, (error, after) in enumerate(spawn(2, mismatched_sizes, tmp_path)):
        assert error.startswith("CollectiveMismatchError"), (rank, error)
        assert "(3,)" in error and "(4,)" in error, error
        assert after == [2.0, 2.0]

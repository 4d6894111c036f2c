"""What torch builds on its collectives, over backend="asyncdist", with real ranks.

Each rank trains on its share of a batch; the result must be the same on
every rank (exactly) and the same as one process training on the whole batch
(to float tolerance): DistributedDataParallel (plain, ``no_sync``,
``find_unused_parameters``, ``static_graph``), ZeroRedundancyOptimizer, and
FSDP2's ``fully_shard``; and DDP with PowerSGD's comm hook, which blocks
inside future callbacks, agrees across ranks. One process start per world
size runs every mode.

A transformer LM under ``fully_shard`` (AdamW) and DTensor's redistributions
and matmuls give bitwise gloo's results: one start of two processes runs
both backends.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from asyncdist.testing import spawn

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from test_torch_collectives import init  # noqa: E402  (same directory; torch is needed first)

STEPS, PER_RANK = 3, 4  # optimizer steps; samples per rank per step


class Net(nn.Module):
    """A small MLP; with ``spare``, also a layer that forward never uses."""

    def __init__(self, spare: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.hidden, self.out = nn.Linear(8, 16), nn.Linear(16, 4)
        if spare:
            self.spare = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.relu(self.hidden(x)))


def batches(size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The whole batch of every step (size * PER_RANK samples), the same everywhere."""
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(size * PER_RANK, 8, generator=gen), torch.randn(size * PER_RANK, 4, generator=gen))
            for _ in range(2 * STEPS)]


def train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: list, no_sync_first: bool = False) -> None:
    """Each step: one backward per batch in ``steps[i]``; the first of two under ``no_sync``."""
    for parts in steps:
        optimizer.zero_grad()
        for i, (x, y) in enumerate(parts):
            local = model.no_sync() if no_sync_first and i == 0 else torch.enable_grad()
            with local:
                F.mse_loss(model(x), y).backward()
        optimizer.step()


def modes(path: Path) -> dict[str, list[torch.Tensor]]:
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, size = init(path)
    mine = [(x.chunk(size)[rank], y.chunk(size)[rank]) for x, y in batches(size)]
    one, two = [[b] for b in mine[:STEPS]], [mine[2 * i:2 * i + 2] for i in range(STEPS)]
    results = {}

    def sgd(model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(model.parameters(), lr=0.1)

    for mode, kwargs in [("plain", {}), ("static_graph", {"static_graph": True}),
                         ("find_unused", {"find_unused_parameters": True})]:
        model = DDP(Net(spare=(mode == "find_unused")), bucket_cap_mb=0.0005, **kwargs)  # several buckets
        train(model, sgd(model), one)
        results[mode] = [p.detach().clone() for p in model.module.parameters()]
    model = DDP(Net())
    train(model, sgd(model), two, no_sync_first=True)
    results["no_sync"] = [p.detach().clone() for p in model.module.parameters()]
    with model.no_sync():  # the gradients stay local: they differ between ranks
        F.mse_loss(model(mine[0][0]), mine[0][1]).backward()
    grads = [torch.zeros(4) for _ in range(size)]
    torch.distributed.all_gather(grads, model.module.out.bias.grad)
    results["no_sync_stays_local"] = len({tuple(g.tolist()) for g in grads}) == size

    # A comm hook that waits for all-reduces inside its future callbacks (compression is
    # lossy: only the agreement between ranks is checked).
    model = DDP(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4)))
    model.register_comm_hook(PowerSGDState(None, matrix_approximation_rank=1, start_powerSGD_iter=2,
                                           min_compression_rate=0.1), powerSGD_hook)
    train(model, sgd(model), one + one)
    results["powersgd"] = [p.detach().clone() for p in model.module.parameters()]

    model = DDP(Net())
    train(model, ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=0.01), one)
    results["zero"] = [p.detach().clone() for p in model.module.parameters()]

    net = Net()
    fully_shard(net.hidden), fully_shard(net.out), fully_shard(net)
    train(net, torch.optim.Adam(net.parameters(), lr=0.01), one)
    results["fsdp"] = [p.full_tensor().detach().clone() for p in net.parameters()]
    torch.distributed.destroy_process_group()
    return results


def reference(size: int) -> dict[str, list[torch.Tensor]]:
    """One process, the whole batch of each step."""
    whole = batches(size)
    one, two = [[b] for b in whole[:STEPS]], [whole[2 * i:2 * i + 2] for i in range(STEPS)]
    results = {}
    for mode, steps, spare, adam in [("plain", one, False, False), ("find_unused", one, True, False),
                                     ("no_sync", two, False, False), ("zero", one, False, True)]:
        model = Net(spare)
        optimizer = (torch.optim.Adam(model.parameters(), lr=0.01) if adam
                     else torch.optim.SGD(model.parameters(), lr=0.1))
        train(model, optimizer, steps)
        results[mode] = [p.detach() for p in model.parameters()]
    results["static_graph"], results["fsdp"] = results["plain"], results["zero"]
    return results


@pytest.mark.parametrize("size", [2, 4])
def test_training_is_identical_on_every_rank_and_matches_one_process(tmp_path: Path, size: int) -> None:
    ranks = spawn(size, modes, tmp_path / "store", timeout=90)
    want = reference(size)
    assert all(got["no_sync_stays_local"] for got in ranks)
    for rank, got in enumerate(ranks):
        assert all(torch.equal(a, b) for a, b in zip(got["powersgd"], ranks[0]["powersgd"])), rank
    for mode, expected in want.items():
        for rank, got in enumerate(ranks):
            assert len(got[mode]) == len(expected), mode
            for a, b, e in zip(got[mode], ranks[0][mode], expected):
                assert torch.equal(a, b), f"{mode}: rank {rank} differs from rank 0"
                torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6, msg=f"{mode} on rank {rank}")


# -- FSDP2 and DTensor: bitwise gloo's -------------------------------------------------

VOCAB, WIDTH = 32, 16


def lm() -> nn.Module:
    """A tiny transformer language model: embedding, two encoder layers, a head."""
    torch.manual_seed(0)
    layers = [nn.TransformerEncoderLayer(WIDTH, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True)
              for _ in range(2)]
    return nn.Sequential(nn.Embedding(VOCAB, WIDTH), *layers, nn.Linear(WIDTH, VOCAB))


def fsdp_and_dtensor(backend: str, path: Path, rank: int) -> dict[str, list[torch.Tensor]]:
    """Three AdamW steps of a fully_shard LM on this rank's tokens, and DTensor's
    redistributions and matmuls, on ``backend``; every result as a full tensor."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    torch.distributed.init_process_group(backend, init_method=f"file://{path}", rank=rank, world_size=2)
    model = lm()
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    tokens = torch.randint(0, VOCAB, (3, 4, 9), generator=torch.Generator().manual_seed(10 + rank))
    for step in tokens:
        optimizer.zero_grad()
        logits = model(step[:, :-1])
        F.cross_entropy(logits.reshape(-1, VOCAB), step[:, 1:].reshape(-1)).backward()
        optimizer.step()
    results = {"fsdp": [p.full_tensor().detach().clone() for p in model.parameters()]}

    mesh = init_device_mesh("cpu", (2,))
    gen = torch.Generator().manual_seed(3)  # the same matrices on both ranks
    a, b = torch.randn(8, 6, generator=gen), torch.randn(6, 4, generator=gen)
    rows = distribute_tensor(a, mesh, [Shard(0)])
    cols = distribute_tensor(a, mesh, [Shard(1)])
    results["dtensor"] = [
        rows.redistribute(mesh, [Replicate()]).to_local(),        # all_gather
        rows.redistribute(mesh, [Shard(1)]).full_tensor(),       # on CPU: all_gather, then a chunk
        (rows @ distribute_tensor(b, mesh, [Replicate()])).full_tensor(),
        (cols @ distribute_tensor(b, mesh, [Shard(0)])).redistribute(mesh, [Replicate()]).to_local(),  # Partial: all_reduce
    ]
    torch.distributed.destroy_process_group()
    return results


def both_backends(tmp: Path) -> dict[str, dict[str, list[torch.Tensor]]]:
    import asyncdist.torch_backend  # noqa: F401  (registers "asyncdist")

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    return {backend: fsdp_and_dtensor(backend, tmp / backend, rank) for backend in ("gloo", "asyncdist")}


def test_fsdp2_transformer_and_dtensor_results_are_bitwise_gloos(tmp_path: Path) -> None:
    ranks = spawn(2, both_backends, tmp_path, timeout=90)
    for rank, got in enumerate(ranks):
        for what in ("fsdp", "dtensor"):
            for mine, gloos in zip(got["asyncdist"][what], got["gloo"][what], strict=True):
                assert torch.equal(mine, gloos), f"{what} on rank {rank} differs from gloo's"
    # Independent of gloo: the FSDP model changed, and the same on both ranks; DTensor's products are a @ b.
    assert not torch.equal(ranks[0]["asyncdist"]["fsdp"][0], lm()[0].weight.detach())
    assert all(torch.equal(x, y) for x, y in zip(ranks[0]["asyncdist"]["fsdp"], ranks[1]["asyncdist"]["fsdp"]))
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(8, 6, generator=gen), torch.randn(6, 4, generator=gen)
    gathered, resharded, product, partial = ranks[0]["asyncdist"]["dtensor"]
    assert torch.equal(gathered, a) and torch.equal(resharded, a)
    torch.testing.assert_close(product, a @ b)
    torch.testing.assert_close(partial, a @ b)

"""What torch builds on its collectives, over backend="asyncdist", with real ranks.

Each rank trains on its share of a batch; the result must be the same on
every rank (exactly) and the same as one process training on the whole batch
(to float tolerance): DistributedDataParallel (plain, ``no_sync``,
``find_unused_parameters``, ``static_graph``), ZeroRedundancyOptimizer, and
FSDP2's ``fully_shard``; and DDP with PowerSGD's comm hook, which blocks
inside future callbacks, agrees across ranks. One process start per world
size runs every mode.
"""

from __future__ import annotations

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

"""Ray Train over asyncdist's torch backend: ``TorchConfig(backend="asyncdist")``.

One TorchTrainer run of 2 workers trains the same small model twice with
DDP: over the default process group (asyncdist, set up by Ray Train), and
over a gloo group of the same ranks made in the same run. Both final weights
must equal each other, and a sequential full-batch reference computed here
(DDP averages the gradients of equal shards: the gradient of the whole
batch's mean loss), to float tolerance. One run, not two: each TorchTrainer
start costs 10-25 s of this folder's CI budget.
"""

from __future__ import annotations

import os
import tempfile

import pytest

torch = pytest.importorskip("torch")
ray = pytest.importorskip("ray")
pytest.importorskip("ray.train.torch", reason="Ray Train is not installed (pip install 'ray[train]')")
from ray.train import Checkpoint, RunConfig, ScalingConfig  # noqa: E402
from ray.train.torch import TorchConfig, TorchTrainer  # noqa: E402

pytestmark = pytest.mark.usefixtures("ray_cluster")

WORKERS = 2
STEPS = 15
LR = 0.1


def _data() -> tuple:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(48, 4, generator=g)
    y = torch.sin(x @ torch.tensor([1.0, -2.0, 3.0, 0.5])).unsqueeze(1)
    return x, y


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def _train(model, x, y) -> list:
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for _ in range(STEPS):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    inner = getattr(model, "module", model)
    return [p.detach().clone() for p in inner.parameters()]


def _train_loop(config: dict) -> None:
    import ray.train
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, n = ray.train.get_context().get_world_rank(), ray.train.get_context().get_world_size()
    x, y = _data()
    shard = slice(rank * len(x) // n, (rank + 1) * len(x) // n)
    result = {"backend": dist.get_backend()}
    result["asyncdist"] = _train(DDP(_model()), x[shard], y[shard])
    result["gloo"] = _train(DDP(_model(), process_group=dist.new_group(backend="gloo")), x[shard], y[shard])
    folder = tempfile.mkdtemp()
    torch.save(result, os.path.join(folder, "weights.pt"))
    ray.train.report({"rank": rank}, checkpoint=Checkpoint.from_directory(folder) if rank == 0 else None)


def test_ddp_over_the_asyncdist_backend_matches_gloo_and_the_sequential_reference(tmp_path) -> None:
    trainer = TorchTrainer(
        _train_loop,
        scaling_config=ScalingConfig(num_workers=WORKERS),
        torch_config=TorchConfig(backend="asyncdist"),
        run_config=RunConfig(storage_path=str(tmp_path), name="asyncdist-ddp"),
    )
    result = trainer.fit()
    assert result.error is None
    with result.checkpoint.as_directory() as folder:
        got = torch.load(os.path.join(folder, "weights.pt"))
    assert got["backend"] == "asyncdist"
    reference = _train(_model(), *_data())
    for ours, gloo, ref in zip(got["asyncdist"], got["gloo"], reference, strict=True):
        torch.testing.assert_close(ours, gloo, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(reference[0], _model()[0].weight)  # it did train

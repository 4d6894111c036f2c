"""torch.distributed over backend="asyncdist" with CUDA tensors (pinned staging underneath).

Two rank processes share the one GPU (staging allows it, NCCL would not).
Each checks torch's own collectives on CUDA tensors against NumPy on every
rank's inputs, an ``async_op`` Work's future chained with ``.then()`` on a
side stream, and one DistributedDataParallel step of a CUDA model against
the same step computed by one process on both ranks' batches.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from asyncdist.testing import spawn

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

N = 2


def _inputs(rank: int) -> np.ndarray:
    return np.random.default_rng(10 + rank).standard_normal(1000).astype(np.float32)


def _batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(20 + rank)
    return torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen)


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _rank(path: str) -> dict[str, np.ndarray]:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import asyncdist.torch_backend  # noqa: F401  (registers "asyncdist")

    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dist.init_process_group("asyncdist", init_method=f"file://{path}", rank=rank, world_size=size,
                            timeout=timedelta(seconds=60))
    out: dict[str, np.ndarray] = {}
    try:
        x = torch.from_numpy(_inputs(rank)).to(device)
        summed = x.clone()
        dist.all_reduce(summed)
        out["all_reduce"] = summed.cpu().numpy()
        root = x.clone()
        dist.broadcast(root, src=1)
        out["broadcast"] = root.cpu().numpy()
        gathered = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(gathered, x)
        out["all_gather"] = torch.stack(gathered).cpu().numpy()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):  # the future's callback reads the result on a side stream
            doubled = x.clone()
            work = dist.all_reduce(doubled, async_op=True)
            out["then"] = work.get_future().then(lambda fut: fut.value()[0] * 2).wait().cpu().numpy()

        model = DistributedDataParallel(_net().to(device))
        inputs, targets = (t.to(device) for t in _batch(rank))
        torch.nn.functional.mse_loss(model(inputs), targets).backward()
        out["ddp_grads"] = np.concatenate([p.grad.cpu().numpy().ravel() for p in model.parameters()])
    finally:
        dist.destroy_process_group()
    return out


def test_torch_collectives_and_ddp_on_cuda_tensors(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (torch.cuda.is_available() is False)")
    results = spawn(N, _rank, str(tmp_path / "store"), timeout=180)

    inputs = [_inputs(r) for r in range(N)]
    reference_grads = []  # DDP averages the ranks' gradients: one process, each batch in turn
    for r in range(N):
        net = _net()
        x, y = _batch(r)
        torch.nn.functional.mse_loss(net(x), y).backward()
        reference_grads.append(np.concatenate([p.grad.numpy().ravel() for p in net.parameters()]))
    for rank, out in enumerate(results):
        np.testing.assert_allclose(out["all_reduce"], sum(inputs), rtol=1e-6, err_msg=f"rank {rank}")
        np.testing.assert_array_equal(out["broadcast"], inputs[1])
        np.testing.assert_array_equal(out["all_gather"], np.stack(inputs))
        np.testing.assert_allclose(out["then"], 2 * sum(inputs), rtol=1e-6)
        np.testing.assert_allclose(out["ddp_grads"], np.mean(reference_grads, axis=0), rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(results[0]["ddp_grads"], results[1]["ddp_grads"])

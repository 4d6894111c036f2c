"""The DDP row: one training step of an MLP under DistributedDataParallel.

What the row measures is what a user of DDP waits for: forward, loss,
backward (during which DDP all-reduces the gradient buckets through the
process group's backend), and an SGD step. The same step runs on
torch.distributed with gloo and with asyncdist's torch backend
(:mod:`asyncdist.torch_backend`); the process group is the only difference.
The timing loop, the agreement on calls per repetition and the reduction
(max over ranks, median over repetitions, one step per repetition when a
step takes longer than ``--min-rep-ms``) are every row's
(:mod:`asyncdist.bench.loops`, :mod:`asyncdist.bench.runner`).

The model is :data:`LAYERS` ``Linear(width, width)`` layers with ReLU
between them, float32, on the CPU; the width is chosen so that the model has
about the parameters asked for (``--ddp-params``, 10 M by default). A row's
``count`` is the model's exact parameter count, so its size in bytes is what
DDP all-reduces per step. Every rank trains on its own fixed random batch of
:data:`BATCH` samples; weights start equal (seed 0), as DDP requires.

Pure arithmetic here (:func:`mlp_width`, :func:`mlp_params`) runs in the
parent; :func:`build_step` runs in a rank process and imports torch.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable

__all__ = ["LAYERS", "BATCH", "mlp_width", "mlp_params", "build_step", "describe", "TrainingStep"]

#: Linear layers in the MLP ("a few", so that DDP has several buckets' worth of layers).
LAYERS = 4
#: Samples per rank per step.
BATCH = 32


def mlp_width(params: int) -> int:
    """The largest width whose weight matrices hold at most ``params`` parameters (at least 1);
    the biases add ``LAYERS * width`` more.

    Idempotent through :func:`mlp_params`: ``mlp_width(mlp_params(w)) == w``.
    """
    return max(1, math.isqrt(max(params, 0) // LAYERS))


def mlp_params(width: int) -> int:
    """Parameters of the MLP of ``width``: :data:`LAYERS` weight matrices and biases."""
    return LAYERS * (width * width + width)


def describe(params: int) -> str:
    """The model in words, for the header and the json."""
    width = mlp_width(params)
    return (f"MLP of {mlp_params(width):,} parameters ({LAYERS} x Linear({width}, {width}) + ReLU, float32), "
            f"batch {BATCH} per rank, SGD")


def build_step(dist: Any, point: Any, device: Any = "cpu") -> list[Callable[[], Any]]:
    """One DDP training step as the row's single call (rank process; imports torch).

    Args:
        dist: the ``torch.distributed`` module, its default group initialised
            (gloo, or the ``"asyncdist"`` backend).
        point: the row's :class:`~asyncdist.bench.cases.Point`; ``count`` is
            the model's parameter count, ``rank`` seeds this rank's batch.
        device: where the model and the batch live (``cuda`` in
            :mod:`asyncdist.bench.cuda_staging`).

    Returns:
        One :class:`TrainingStep`.
    """
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    # As torchrun sets OMP_NUM_THREADS=1 for several workers: ranks that each
    # took every core would measure the oversubscription, not the backend.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // point.world_size))
    width = mlp_width(point.count)
    torch.manual_seed(0)  # the same initial weights on every rank
    layers: list[nn.Module] = []
    for index in range(LAYERS):
        layers += [nn.Linear(width, width)] + ([nn.ReLU()] if index < LAYERS - 1 else [])
    model = DistributedDataParallel(nn.Sequential(*layers).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(1 + point.rank)
    inputs = torch.randn(BATCH, width, generator=generator).to(device)
    targets = torch.randn(BATCH, width, generator=generator).to(device)
    return [TrainingStep(model, optimizer, inputs, targets, nn.functional.mse_loss)]


class TrainingStep:
    """One DDP training step, as a call; ``model`` is the DDP-wrapped model (for checks)."""

    def __init__(self, model: Any, optimizer: Any, inputs: Any, targets: Any, loss: Callable[[Any, Any], Any]) -> None:
        self.model, self._optimizer, self._inputs, self._targets, self._loss = model, optimizer, inputs, targets, loss

    def __call__(self) -> None:
        self._optimizer.zero_grad(set_to_none=False)
        self._loss(self.model(self._inputs), self._targets).backward()  # DDP all-reduces the gradients here
        self._optimizer.step()

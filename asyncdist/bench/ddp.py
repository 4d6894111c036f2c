"""The DDP rows: one training step of an MLP, with and without DistributedDataParallel.

``--ops ddp`` measures three rows, so that where a DDP step loses shows
without a profiler:

* ``ddp_compute``: the same model's step with no DDP and no communication
  (forward, loss, backward, SGD step);
* ``ddp_flat``: that step, then the gradients flattened into one buffer,
  all-reduced in one call and copied back before the SGD step (no overlap);
* ``ddp``: the step under DistributedDataParallel, which all-reduces the
  gradient buckets during backward.

The DDP step minus the compute-only step is the communication the step
exposes (:func:`asyncdist.bench.report.ddp_lines`). The same steps run on
torch.distributed with gloo and with asyncdist's torch backend
(:mod:`asyncdist.torch_backend`); the process group is the only difference.
The timing loop, the agreement on calls per repetition and the reduction
(max over ranks, median over repetitions, one step per repetition) are
every row's (:mod:`asyncdist.bench.loops`, :mod:`asyncdist.bench.runner`).

The model is :data:`LAYERS` ``Linear(width, width)`` layers with ReLU
between them, float32, on the CPU; the width is chosen so that the model has
about the parameters asked for (``--ddp-params``, 10 M by default). A row's
``count`` is the model's exact parameter count, so its size in bytes is what
DDP all-reduces per step. Every rank trains on its own fixed random batch of
:data:`BATCH` samples; weights start equal (seed 0), as DDP requires.

Pure arithmetic here (:func:`mlp_width`, :func:`mlp_params`) runs in the
parent; the builders run in a rank process and import torch.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable

__all__ = [
    "LAYERS", "BATCH", "STEP_OPS", "mlp_width", "mlp_params", "build_step", "build_compute", "build_flat",
    "build_mlp", "describe", "TrainingStep",
]

#: Linear layers in the MLP ("a few", so that DDP has several buckets' worth of layers).
LAYERS = 4
#: Samples per rank per step.
BATCH = 32

#: The rows ``--ops ddp`` stands for, in the order they are measured.
STEP_OPS = ("ddp_compute", "ddp_flat", "ddp")


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


def build_mlp(point: Any, device: Any = "cpu") -> tuple[Any, Any, Any]:
    """The MLP of ``point.count`` parameters (equal weights on every rank) and
    this rank's batch: ``(model, inputs, targets)`` (rank process; imports torch).

    Also limits torch to this rank's share of the cores, as torchrun sets
    OMP_NUM_THREADS=1 for several workers: ranks that each took every core
    would measure the oversubscription, not the backend.
    """
    import torch
    from torch import nn

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // point.world_size))
    width = mlp_width(point.count)
    torch.manual_seed(0)  # the same initial weights on every rank
    layers: list[nn.Module] = []
    for index in range(LAYERS):
        layers += [nn.Linear(width, width)] + ([nn.ReLU()] if index < LAYERS - 1 else [])
    generator = torch.Generator().manual_seed(1 + point.rank)
    inputs = torch.randn(BATCH, width, generator=generator).to(device)
    targets = torch.randn(BATCH, width, generator=generator).to(device)
    return nn.Sequential(*layers).to(device), inputs, targets


def _step(model: Any, inputs: Any, targets: Any, before_step: Callable[[], None] | None = None) -> TrainingStep:
    import torch

    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    return TrainingStep(model, optimizer, inputs, targets, torch.nn.functional.mse_loss, before_step)


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
    from torch.nn.parallel import DistributedDataParallel

    model, inputs, targets = build_mlp(point, device)
    return [_step(DistributedDataParallel(model), inputs, targets)]


def build_compute(dist: Any, point: Any) -> list[Callable[[], Any]]:
    """The same step with no DDP and no communication (the ``ddp_compute`` row)."""
    return [_step(*build_mlp(point))]


def build_flat(dist: Any, point: Any) -> list[Callable[[], Any]]:
    """The same step, then every gradient flattened into one buffer, all-reduced
    in one call, averaged and copied back before the SGD step (the ``ddp_flat`` row)."""
    import torch

    model, inputs, targets = build_mlp(point)
    params = list(model.parameters())
    flat = torch.zeros(sum(p.numel() for p in params))
    views = [view.view_as(p) for view, p in zip(flat.split([p.numel() for p in params]), params)]

    def all_reduce_gradients() -> None:
        for view, param in zip(views, params):
            view.copy_(param.grad)
        dist.all_reduce(flat)
        flat.div_(point.world_size)
        for view, param in zip(views, params):
            param.grad.copy_(view)

    return [_step(model, inputs, targets, all_reduce_gradients)]


class TrainingStep:
    """One DDP training step, as a call; ``model`` is the DDP-wrapped model (for checks)."""

    def __init__(self, model: Any, optimizer: Any, inputs: Any, targets: Any, loss: Callable[[Any, Any], Any],
                 before_step: Callable[[], None] | None = None) -> None:
        self.model, self._optimizer, self._inputs, self._targets, self._loss = model, optimizer, inputs, targets, loss
        self._before_step = before_step

    def __call__(self) -> None:
        self._optimizer.zero_grad(set_to_none=False)
        self._loss(self.model(self._inputs), self._targets).backward()  # DDP all-reduces the gradients here
        if self._before_step is not None:
            self._before_step()
        self._optimizer.step()

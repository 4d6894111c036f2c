"""The chaos benchmark's model: a small MLP in plain NumPy (float64), its batches and its reference.

Every path of :mod:`asyncdist.bench.chaos` trains the same model, so that
the final weights of each can be checked against one fault-free sequential
run (:func:`references`). NumPy, not torch: asyncdist's own path needs no
torch, and a process that imports torch costs seconds of CPU at start-up,
which a replacement would pay at every failure.

Step ``s`` trains on global batch ``s`` (:func:`batch`: drawn from the seed
and ``s`` alone). A group of ``n`` ranks splits it by rows (rank ``r`` takes
rows ``r::n``), each rank sums its rows' gradients, and the update divides
the all-reduced sum by the batch size: a step's update is the same whatever
the group's size, so the weights after ``k`` committed steps equal
:func:`references` after ``k`` steps, up to the order of the sums (1e-13 or
so). The targets are random at every step, so the gradients never vanish:
a step applied twice, or lost, moves the weights by about ``LR``, far above
the tolerance of :func:`matches`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Model", "batch", "grad", "apply", "references", "matches"]

LR = 0.01


@dataclass(frozen=True)
class Model:
    """The MLP's shape: ``inputs -> hidden (tanh) -> outputs``, squared error, batches of ``batch_size``."""

    inputs: int = 32
    hidden: int = 64
    outputs: int = 8
    batch_size: int = 64
    seed: int = 0

    @property
    def size(self) -> int:
        """The number of parameters (one flat float64 vector)."""
        return self.inputs * self.hidden + self.hidden + self.hidden * self.outputs + self.outputs

    def init(self) -> np.ndarray:
        """The initial parameters, from the seed."""
        rng = np.random.default_rng([self.seed, 1 << 30])
        return rng.standard_normal(self.size) * 0.1

    def _split(self, params: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        i, h, o = self.inputs, self.hidden, self.outputs
        w1 = params[: i * h].reshape(i, h)
        b1 = params[i * h: i * h + h]
        w2 = params[i * h + h: i * h + h + h * o].reshape(h, o)
        return w1, b1, w2, params[i * h + h + h * o:]


def batch(model: Model, step: int) -> tuple[np.ndarray, np.ndarray]:
    """Global batch ``step``: features and random targets, the same in every process."""
    rng = np.random.default_rng([model.seed, step])
    return (rng.standard_normal((model.batch_size, model.inputs)),
            rng.standard_normal((model.batch_size, model.outputs)))


def grad(model: Model, params: np.ndarray, step: int, rank: int, size: int) -> np.ndarray:
    """The summed gradient of rows ``rank::size`` of batch ``step`` (zeros for ``rank`` < 0)."""
    if rank < 0:
        return np.zeros(model.size)
    features, targets = batch(model, step)
    x, t = features[rank::size], targets[rank::size]
    w1, b1, w2, b2 = model._split(params)
    h = np.tanh(x @ w1 + b1)
    err = h @ w2 + b2 - t  # d(0.5 * sum(err^2)) / d(output)
    dh = (err @ w2.T) * (1 - h * h)
    return np.concatenate([(x.T @ dh).ravel(), dh.sum(0), (h.T @ err).ravel(), err.sum(0)])


def apply(model: Model, params: np.ndarray, summed: np.ndarray) -> None:
    """One SGD step in place, from the gradient summed over the whole batch."""
    params -= LR * summed / model.batch_size


def references(model: Model, counts: list[int]) -> dict[int, np.ndarray]:
    """The parameters after each of ``counts`` steps (ascending) on one process, with no fault: one pass."""
    params, out, step = model.init(), {}, 0
    for count in counts:
        while step < count:
            apply(model, params, grad(model, params, step, 0, 1))
            step += 1
        out[count] = params.copy()
    return out


def matches(params: np.ndarray, expected: np.ndarray) -> bool:
    """Whether ``params`` equal ``expected`` up to the order of the sums (rtol 1e-9)."""
    return params.shape == expected.shape and bool(np.allclose(params, expected, rtol=1e-9, atol=1e-12))

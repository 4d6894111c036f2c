"""The FSDP2 row: one training step of a small transformer LM under ``fully_shard``.

FSDP2 shards every parameter over the ranks: each layer's forward and
backward all-gathers its parameters (``all_gather_into_tensor``), and its
backward reduce-scatters the gradients (``reduce_scatter_tensor``), so a
step is many small collectives, where a backend's cost per call counts more
than its bandwidth. The step runs on torch.distributed with gloo and with
asyncdist's torch backend (:mod:`asyncdist.torch_backend`); the process
group is the only difference.

The model is fixed (:data:`VOCAB`, :data:`WIDTH`, :data:`LAYERS`, ...): an
embedding, :data:`LAYERS` ``nn.TransformerEncoderLayer`` (causal, no
dropout) and a linear head, each layer and the root ``fully_shard``-ed,
trained with AdamW on a fixed random batch per rank; weights start equal
(seed 0). The row's ``count`` is its parameter count (:func:`params`,
checked against the model in the rank).

:func:`params` and :func:`describe` run in the parent; :func:`build_step`
runs in a rank process and imports torch.
"""

from __future__ import annotations

from typing import Any, Callable

from .ddp import TrainingStep

__all__ = ["VOCAB", "WIDTH", "HEADS", "LAYERS", "SEQUENCE", "BATCH", "params", "describe", "build_step"]

VOCAB, WIDTH, HEADS, LAYERS = 1024, 128, 4, 3
#: Tokens per sample and samples per rank per step.
SEQUENCE, BATCH = 64, 8


def params() -> int:
    """The model's parameter count: embedding, layers (attention, feed-forward
    of 4 x WIDTH, two layer norms) and head."""
    d, ff = WIDTH, 4 * WIDTH
    layer = (3 * d * d + 3 * d) + (d * d + d) + (d * ff + ff) + (ff * d + d) + 2 * 2 * d
    return VOCAB * d + LAYERS * layer + (d * VOCAB + VOCAB)


def describe() -> str:
    """The model in words, for the header."""
    return (f"transformer LM of {params():,} parameters (vocab {VOCAB}, width {WIDTH}, {LAYERS} layers, "
            f"{HEADS} heads), sequence {SEQUENCE}, batch {BATCH} per rank, FSDP2 fully_shard per layer, AdamW")


def build_step(dist: Any, point: Any) -> list[Callable[[], Any]]:
    """One FSDP2 training step as the row's single call (rank process; imports torch).

    Raises:
        AssertionError: the model's parameters are not :func:`params` (the row's size would lie).
    """
    import os

    import torch
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // point.world_size))
    torch.manual_seed(0)
    model = _language_model_class()()
    count = sum(p.numel() for p in model.parameters())
    assert count == params() == point.count, f"fsdp: the model has {count} parameters, the row says {point.count}"
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    generator = torch.Generator().manual_seed(1 + point.rank)
    tokens = torch.randint(VOCAB, (BATCH, SEQUENCE + 1), generator=generator)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def loss(logits: Any, targets: Any) -> Any:
        return nn.functional.cross_entropy(logits, targets.reshape(-1))

    return [TrainingStep(model, optimizer, tokens[:, :-1], tokens[:, 1:], loss)]


def _language_model_class() -> type:
    from torch import nn

    class LanguageModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, WIDTH)
            self.layers = nn.ModuleList(
                nn.TransformerEncoderLayer(WIDTH, HEADS, 4 * WIDTH, dropout=0.0, batch_first=True)
                for _ in range(LAYERS))
            self.head = nn.Linear(WIDTH, VOCAB)

        def forward(self, tokens: Any) -> Any:
            x = self.embed(tokens)
            mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1])
            for layer in self.layers:
                x = layer(x, src_mask=mask, is_causal=True)
            return self.head(x.reshape(-1, WIDTH))  # 2-d: FSDP2 warns of a view returned

    return LanguageModel


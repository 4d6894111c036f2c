#!/usr/bin/env python
"""Synchronous SGD from torch's tutorial, on plain torch.distributed with the
asyncdist backend.

The tutorial ("Writing Distributed Applications with PyTorch", "Distributed
Training"): every rank trains the same model on its share of the data and
all-reduces the gradients after each backward pass. The script is torch's,
``import torch.distributed as dist`` and all; the only changes are the import
that registers the backend and ``backend="asyncdist"``, so every all-reduce
runs on asyncdist's engine. The data are synthetic (fixed seed, no
downloads): 20 features labelled by a fixed random linear "teacher".

    torchrun --nproc-per-node 2 examples/torch_sgd_asyncdist_backend.py
    asyncdist-run --nproc-per-node 2 examples/torch_sgd_asyncdist_backend.py

Each rank prints its loss per epoch, then a sha256 of its parameters, which
is the same on every rank: each applied the same averaged gradients.
"""
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import asyncdist.torch_backend  # noqa: F401  registers backend="asyncdist"


def partition_dataset(rank, size):
    """This rank's share of a synthetic dataset, in batches of 128 // size."""
    gen = torch.Generator().manual_seed(1234)
    features = torch.randn(1024, 20, generator=gen)
    labels = (features @ torch.randn(20, 4, generator=gen)).argmax(dim=1)
    mine = torch.randperm(1024, generator=gen).chunk(size)[rank]
    bsz = 128 // size
    return list(zip(features[mine].split(bsz), labels[mine].split(bsz)))


def average_gradients(model):
    """Gradient averaging (the tutorial's)."""
    size = float(dist.get_world_size())
    for param in model.parameters():
        dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)
        param.grad.data /= size


def run(rank, size):
    """Distributed synchronous SGD."""
    torch.manual_seed(1234)
    batches = partition_dataset(rank, size)
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 4), nn.LogSoftmax(dim=1))
    for epoch in range(5):
        epoch_loss = 0.0
        for data, target in batches:
            model.zero_grad()
            loss = F.nll_loss(model(data), target)
            epoch_loss += loss.item()
            loss.backward()
            average_gradients(model)
            with torch.no_grad():  # optim.SGD(lr=0.2).step(), without importing torch.optim
                for param in model.parameters():
                    param -= 0.2 * param.grad
        # One write per line, so that the lines of concurrent ranks never interleave.
        print(f"Rank {rank}, epoch {epoch}: {epoch_loss / len(batches):.4f}\n", end="", flush=True)
    params = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
    print(f"Rank {rank} final loss {epoch_loss / len(batches):.4f} "
          f"params sha256 {hashlib.sha256(params).hexdigest()}\n", end="", flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)  # a few small processes per core
    dist.init_process_group(backend="asyncdist")  # env://, as torchrun or asyncdist-run set it
    run(dist.get_rank(), dist.get_world_size())
    dist.destroy_process_group()

#!/usr/bin/env python
"""DistributedDataParallel over the asyncdist backend.

A small MLP learns a synthetic regression task (a fixed random "teacher"
network, fixed seeds, no downloads). DDP all-reduces the gradient buckets
during the backward pass; with ``backend="asyncdist"`` those all-reduces run
on asyncdist's engine. Everything else is plain torch.

    torchrun --nproc-per-node 2 examples/torch_ddp.py
    asyncdist-run --nproc-per-node 2 examples/torch_ddp.py

Each rank prints its loss every 10 steps and, at the end, a sha256 of its
parameters: the same on every rank, since DDP keeps the replicas identical.
"""
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import asyncdist.torch_backend  # noqa: F401  registers backend="asyncdist"

STEPS, BATCH = 40, 32  # BATCH samples per rank per step


def batches(rank, size):
    """This rank's batches: every rank draws the same samples and keeps its slice."""
    gen = torch.Generator().manual_seed(7)
    teacher = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    for param in teacher.parameters():
        param.requires_grad_(False)
    for _ in range(STEPS):
        x = torch.randn(BATCH * size, 16, generator=gen)
        mine = slice(rank * BATCH, (rank + 1) * BATCH)
        yield x[mine], teacher(x)[mine]


def main():
    torch.set_num_threads(1)  # a few small processes per core
    dist.init_process_group(backend="asyncdist")  # env://, as torchrun or asyncdist-run set it
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial model on every rank (DDP broadcasts rank 0's anyway)
    model = DDP(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4)))
    first = last = None
    for step, (x, y) in enumerate(batches(rank, size)):
        model.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()  # DDP all-reduces the gradients here
        with torch.no_grad():  # optim.SGD(lr=0.1).step(), without importing torch.optim
            for param in model.parameters():
                param -= 0.1 * param.grad
        first = loss.item() if first is None else first
        last = loss.item()
        if step % 10 == 0:
            print(f"rank {rank} step {step} loss {last:.4f}\n", end="", flush=True)
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    print(f"rank {rank} done: loss {first:.4f} -> {last:.4f}, params sha256 {digest}\n", end="", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""Elastic SGD: the tutorial's SGD (``tutorial_sgd.py``) goes on when a rank dies,
and takes in a replacement.

    asyncdist-run --nproc-per-node 4 --on-failure continue --replace 1 \\
        examples/elastic_sgd.py --kill-rank 3 --kill-step 6 --grow-step 10

Step ``s`` trains on global batch ``s`` (128 samples drawn with seed ``s``),
split among the ranks of the moment; each rank sums its samples' losses and
the update divides the all-reduced sum by 128, so a step's update is the
same whatever the group's size: the final parameters equal plain SGD on
one process (tests/examples/test_elastic_sgd.py checks it).

At ``--kill-step`` rank ``--kill-rank`` kills itself with SIGKILL. The others
get ``PeerLostError``, shrink the default group to the survivors
(``dist.shrink_group()``), agree on the step to redo (the earliest that
failed anywhere: a rank may have finished a step that failed on another)
and go on from their copy of the parameters before it. The launcher starts
a replacement (``--replace``), which waits in ``init_process_group``
(``ASYNCDIST_JOIN=1``) until the survivors call ``dist.grow_group()`` at
``--grow-step``; the grown group's rank 0 then broadcasts the step and the
parameters to it. A rank killed after ``--grow-step`` is not replaced: the
survivors finish, and the launcher tells the waiting replacement that it was
never admitted: it raises ``JoinClosedError`` and exits.
"""
import argparse
import hashlib
import os
import signal

import numpy as np
import torch
import torch.nn.functional as F

import asyncdist as dist
from asyncdist.errors import PeerLostError
from tutorial_sgd import Net

BATCH, LR = 128, 0.2


def dataset():
    """The tutorial's synthetic data: 1024 samples, labelled by a fixed "teacher"."""
    gen = torch.Generator().manual_seed(1234)
    features = torch.randn(1024, 20, generator=gen)
    return features, (features @ torch.randn(20, 4, generator=gen)).argmax(dim=1)


def batch(step):
    """The sample indices of global batch ``step``."""
    return torch.randperm(1024, generator=torch.Generator().manual_seed(step))[:BATCH]


def train_step(model, data, step):
    """One SGD step on this rank's share of batch ``step``."""
    features, labels = data
    mine = batch(step)[dist.get_rank()::dist.get_world_size()]
    model.zero_grad()
    F.nll_loss(model(features[mine]), labels[mine], reduction="sum").backward()
    for param in model.parameters():
        dist.all_reduce(param.grad)
    with torch.no_grad():
        for param in model.parameters():
            param -= LR * param.grad / BATCH


def share_state(model, step):
    """The step and parameters of the group's rank 0, on every rank (for a newcomer).

    ``group_src``, not ``src``: after a shrink, global rank 0 may be the rank that died.
    """
    box = torch.tensor([step])
    dist.broadcast(box, group_src=0)
    for param in model.parameters():
        dist.broadcast(param.data, group_src=0)
    return int(box)


def main():
    parser = argparse.ArgumentParser()
    for flag, default in (("--steps", 16), ("--kill-rank", 3), ("--kill-step", 6), ("--grow-step", 10)):
        parser.add_argument(flag, type=int, default=default)
    parser.add_argument("--out", help="where rank 0 saves the final parameters (.npz)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # with ASYNCDIST_JOIN=1: waits for the survivors' grow_group()
    joined, lost = os.environ.get("ASYNCDIST_JOIN") == "1", False
    doomed = dist.get_rank() == args.kill_rank and not joined
    torch.manual_seed(1234)
    model, data = Net(), dataset()
    step = share_state(model, 0) if joined else 0
    before = {}  # the parameters before each of the last two steps
    while step < args.steps:
        if step == args.kill_step and doomed:
            os.kill(os.getpid(), signal.SIGKILL)
        if step == args.grow_step and lost:
            dist.grow_group(min_joiners=1)  # the launcher's replacement joins here
            share_state(model, step)
            lost = False
        before = {step - 1: before.get(step - 1), step: [p.detach().clone() for p in model.parameters()]}
        try:
            train_step(model, data, step)
            step += 1
        except PeerLostError as exc:
            print(f"rank {dist.get_rank()}: step {step} failed ({exc}); shrinking\n", end="", flush=True)
            dist.shrink_group()  # the survivors, renumbered; the default group from now on
            redo = torch.tensor([step])
            dist.all_reduce(redo, op=dist.ReduceOp.MIN)
            step, lost = int(redo), True
            with torch.no_grad():
                for param, saved in zip(model.parameters(), before[step]):
                    param.copy_(saved)
    params = [p.detach().numpy() for p in model.parameters()]
    digest = hashlib.sha256(b"".join(p.tobytes() for p in params)).hexdigest()
    print(f"rank {dist.get_rank()} of {dist.get_world_size()}: {step} steps, params sha256 {digest}\n", end="",
          flush=True)
    if args.out and dist.get_rank() == 0:
        np.savez(args.out, *params)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""All-reduce within a group, from torch's tutorial
"Writing Distributed Applications with PyTorch" (run.py template + run).

The only change from the tutorial: ``import asyncdist as dist`` instead of
``import torch.distributed as dist`` (and MASTER_PORT may come from the
environment, so that tests can pick a free port). Each rank prints
``tensor(2.)``: the sum of the ones of ranks 0 and 1.

    python examples/tutorial_all_reduce_group.py
"""
import os
import sys
import torch
import asyncdist as dist
import torch.multiprocessing as mp


def run(rank, size):
    """ Simple collective communication. """
    group = dist.new_group([0, 1])
    tensor = torch.ones(1)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    print('Rank ', rank, ' has data ', tensor[0])


def init_process(rank, size, fn, backend='gloo'):
    """ Initialize the distributed environment. """
    os.environ['MASTER_ADDR'] = '127.0.0.1'
    os.environ.setdefault('MASTER_PORT', '29500')
    dist.init_process_group(backend, rank=rank, world_size=size)
    fn(rank, size)


if __name__ == "__main__":
    world_size = 2
    processes = []
    if "google.colab" in sys.modules:
        print("Running in Google Colab")
        mp.get_context("spawn")
    else:
        mp.set_start_method("spawn")
    for rank in range(world_size):
        p = mp.Process(target=init_process, args=(rank, world_size, run))
        p.start()
        processes.append(p)

    for p in processes:
        p.join()
    sys.exit(max(p.exitcode for p in processes))

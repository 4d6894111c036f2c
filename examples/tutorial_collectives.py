#!/usr/bin/env python
"""The collectives listed in torch's tutorial
"Writing Distributed Applications with PyTorch" ("Collective Communication"),
each run once on 4 ranks with the tutorial's run.py template.

The tutorial lists broadcast, reduce, all_reduce, scatter, gather,
all_gather, barrier and all_to_all with their signatures; ``run`` calls each
as listed and prints one line per result, ``rank R <collective>: <values>``.
The only change from the tutorial's template: ``import asyncdist as dist``
instead of ``import torch.distributed as dist`` (and MASTER_PORT may come from
the environment, so that tests can pick a free port).

    python examples/tutorial_collectives.py
"""
import os
import sys
import torch
import asyncdist as dist
import torch.multiprocessing as mp


def run(rank, size):
    """ Every collective of the tutorial's list, on the whole world. """
    group = dist.new_group(list(range(size)))
    results = {}

    # broadcast(tensor, src, group): rank 0's tensor everywhere.
    tensor = torch.tensor([float(rank)]) + 10
    dist.broadcast(tensor, 0, group)
    results['broadcast'] = tensor.tolist()

    # reduce(tensor, dst, op, group): the sum lands on dst (other ranks'
    # tensors are scratch space: torch does not define what they hold after).
    tensor = torch.tensor([float(rank + 1)])
    dist.reduce(tensor, 0, dist.ReduceOp.SUM, group)
    results['reduce'] = tensor.tolist() if rank == 0 else None

    # all_reduce(tensor, op, group): the product everywhere.
    tensor = torch.tensor([float(rank + 1)])
    dist.all_reduce(tensor, dist.ReduceOp.PRODUCT, group)
    results['all_reduce'] = tensor.tolist()

    # scatter(tensor, scatter_list, src, group): scatter_list[i] to rank i.
    tensor = torch.zeros(1)
    scatter_list = [torch.tensor([100.0 + i]) for i in range(size)] if rank == 0 else None
    dist.scatter(tensor, scatter_list, 0, group)
    results['scatter'] = tensor.tolist()

    # gather(tensor, gather_list, dst, group): every tensor to dst.
    gather_list = [torch.zeros(1) for _ in range(size)] if rank == 0 else None
    dist.gather(torch.tensor([float(rank * rank)]), gather_list, 0, group)
    results['gather'] = [t.item() for t in gather_list] if gather_list else None

    # all_gather(tensor_list, tensor, group): every tensor everywhere.
    tensor_list = [torch.zeros(1) for _ in range(size)]
    dist.all_gather(tensor_list, torch.tensor([float(-rank)]), group)
    results['all_gather'] = [t.item() for t in tensor_list]

    # all_to_all(output_tensor_list, input_tensor_list, group): input[j] to rank j.
    output = [torch.zeros(1) for _ in range(size)]
    dist.all_to_all(output, [torch.tensor([10.0 * rank + j]) for j in range(size)], group)
    results['all_to_all'] = [t.item() for t in output]

    # barrier(group): returns once every rank has entered it.
    dist.barrier(group)
    for name, value in results.items():
        # One write per line, so that lines of concurrent ranks never interleave.
        print(f"rank {rank} {name}: {value}\n", end="", flush=True)


def init_process(rank, size, fn, backend='gloo'):
    """ Initialize the distributed environment. """
    os.environ['MASTER_ADDR'] = '127.0.0.1'
    os.environ.setdefault('MASTER_PORT', '29500')
    dist.init_process_group(backend, rank=rank, world_size=size)
    fn(rank, size)


if __name__ == "__main__":
    world_size = 4
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

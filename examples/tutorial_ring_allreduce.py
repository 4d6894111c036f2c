#!/usr/bin/env python
"""A hand-written ring allreduce, from torch's tutorial
"Writing Distributed Applications with PyTorch" ("Our Own Ring-Allreduce").

``allreduce`` is the tutorial's, unchanged; ``run`` calls it on 4 ranks and
checks it against ``dist.all_reduce``. The only change to the tutorial's
code: ``import asyncdist as dist`` instead of ``import torch.distributed as
dist`` (and MASTER_PORT may come from the environment, so that tests can pick
a free port).

    python examples/tutorial_ring_allreduce.py
"""
import os
import sys
import torch
import asyncdist as dist
import torch.multiprocessing as mp


""" Implementation of a ring-reduce with addition. """
def allreduce(send, recv):
   rank = dist.get_rank()
   size = dist.get_world_size()
   send_buff = send.clone()
   recv_buff = send.clone()
   accum = send.clone()

   left = ((rank - 1) + size) % size
   right = (rank + 1) % size

   for i in range(size - 1):
       if i % 2 == 0:
           # Send send_buff
           send_req = dist.isend(send_buff, right)
           dist.recv(recv_buff, left)
           accum[:] += recv_buff[:]
       else:
           # Send recv_buff
           send_req = dist.isend(recv_buff, right)
           dist.recv(send_buff, left)
           accum[:] += send_buff[:]
       send_req.wait()
   recv[:] = accum[:]


def run(rank, size):
    """ Ring-allreduce a tensor and compare with the library's all_reduce. """
    send = torch.arange(4, dtype=torch.float32) * (rank + 1)
    recv = torch.zeros(4)
    allreduce(send, recv)
    expected = send.clone()
    dist.all_reduce(expected, op=dist.ReduceOp.SUM)
    # One write per line, so that lines of concurrent ranks never interleave.
    print(f"rank {rank}: ring {recv.tolist()} all_reduce {expected.tolist()} "
          f"equal {torch.equal(recv, expected)}\n", end="", flush=True)


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

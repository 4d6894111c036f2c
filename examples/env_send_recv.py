#!/usr/bin/env python
"""Two independently started processes exchange a tensor through env://.

Start each rank in its own shell (any free port):

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 python examples/env_send_recv.py
    RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 python examples/env_send_recv.py

Rank 0 serves the rendezvous store on MASTER_PORT; rank 1 may start first,
it waits for rank 0 (up to the timeout).
"""
import torch

import asyncdist as dist


def main() -> None:
    dist.init_process_group()  # env:// by default
    rank = dist.get_rank()
    tensor = torch.arange(8, dtype=torch.float32)
    if rank == 0:
        dist.send(tensor * 10, dst=1)
        dist.recv(tensor, src=1)
    else:
        dist.recv(tensor, src=0)
        dist.send(tensor + 1, dst=0)
    print(f"rank {rank}: {tensor.tolist()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

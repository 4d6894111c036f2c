#!/usr/bin/env python
"""The await API: a parameter server that serves its workers in any order.

Rank 0 holds the weights of a linear model; every other rank is a worker with
its own synthetic data (noiseless, from one known target) and its own speed.
A worker sends a gradient and waits for fresh weights; the server takes
gradients in whatever order they arrive (``recv(src=None)`` returns the
sender), applies each and answers that worker only. After ``UPDATES`` updates
it answers each worker's next gradient with "stop". Then every rank checks
that the server applied exactly the gradients the workers sent and that the
weights reached the target. Every rank is a coroutine, so the same code runs
all ranks in one event loop or one rank per process.

    python examples/parameter_server.py                                # 4 ranks in one loop
    asyncdist-run --nproc-per-node 3 examples/parameter_server.py      # one process per rank
"""
import asyncio
import os

import numpy as np

import asyncdist
from asyncdist.testing import local_world

DIM, UPDATES, LR, TOL = 8, 300, 0.2, 1e-6
TARGET = np.random.default_rng(0).normal(size=DIM)  # known to every rank


async def server(world: asyncdist.ProcessGroup, w: np.ndarray) -> int:
    grad, reply = np.empty(DIM), np.empty(DIM + 1)  # reply: the weights, then a stop flag
    sent_by, working = [0] * world.size, world.size - 1
    while working:
        sender = await world.recv(grad, src=None)  # whichever worker is ready first
        w -= LR * grad
        sent_by[sender] += 1
        stop = sum(sent_by) >= UPDATES
        if stop:
            working -= 1
        reply[:DIM], reply[DIM] = w, stop
        await world.send(reply, dst=sender)
    counts = ", ".join(f"worker {r}: {n}" for r, n in enumerate(sent_by) if r)
    print(f"server: {sum(sent_by)} updates, from {counts}\n", end="", flush=True)
    return sum(sent_by)


async def worker(world: asyncdist.ProcessGroup, w: np.ndarray) -> int:
    rng = np.random.default_rng(world.rank)
    x = rng.normal(size=(64, DIM))
    y = x @ TARGET
    reply, sends = np.empty(DIM + 1), 0
    while True:
        grad = x.T @ (x @ w - y) / len(y)
        await asyncio.sleep(0.001 * world.rank)  # slower ranks "compute" longer
        await world.send(grad, dst=0)
        await world.recv(reply, src=0)
        sends += 1
        w[:] = reply[:DIM]
        if reply[DIM]:
            return sends


async def rank_main(world: asyncdist.ProcessGroup) -> None:
    w = np.zeros(DIM)
    await world.broadcast(w, src=0)  # everyone starts from the server's weights
    done = await (server(world, w) if world.rank == 0 else worker(world, w))
    await world.broadcast(w, src=0)  # the server's final weights
    counts = np.array([done, 0] if world.rank == 0 else [0, done])
    await world.all_reduce(counts)  # [updates applied, gradients sent]
    error = float(np.abs(w - TARGET).max())
    if counts[0] != counts[1] or error > TOL:
        raise RuntimeError(f"rank {world.rank}: {counts[0]} updates for {counts[1]} sends, error {error:.1e}")
    print(f"rank {world.rank}: {counts[0]} updates == {counts[1]} gradients sent, "
          f"distance to the target {error:.1e}\n", end="", flush=True)


async def main() -> None:
    if "RANK" in os.environ:  # started by asyncdist-run: this process is one rank
        async with await asyncdist.init_world() as world:
            await rank_main(world)
    else:  # every rank in this event loop, over real sockets
        async with local_world(4) as worlds:
            await asyncio.gather(*(rank_main(w) for w in worlds))


if __name__ == "__main__":
    asyncio.run(main())

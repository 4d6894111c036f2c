#!/usr/bin/env python
"""A parameter server on Ray: ranks as async Ray actors, the await API in each.

Ray places four ranks (a placement group, spread over the nodes where there
are several) and asyncdist connects them; no MASTER_ADDR, no port to pick.
Rank 0 serves the weights of a linear model; ranks 1-3 are workers, each with
its own shard of noiseless data from one known target. A worker pushes a
gradient (tag PUSH) and pulls fresh weights; the server serves whichever
worker is ready first (``recv(src=None)`` returns the sender), so fast
workers never wait for slow ones. Each coroutine runs on its actor's own
event loop. The driver gets every rank's result back and checks them.

    pip install "asyncdist[ray]"
    python examples/ray_parameter_server.py       # a local Ray cluster of 4 CPUs
"""
import asyncio

import numpy as np
import ray

from asyncdist.ray import ray_world

RANKS, DIM, UPDATES, LR = 4, 6, 240, 0.2
PUSH, PULL = 1, 2  # tags: gradients to the server, weights (and a stop flag) back


def shard(rank: int) -> tuple[np.ndarray, np.ndarray]:
    """Worker ``rank``'s data: 32 noiseless samples of ``x @ target``."""
    target = np.random.default_rng(0).normal(size=DIM)
    x = np.random.default_rng(rank).normal(size=(32, DIM))
    return x, x @ target


async def serve(world) -> dict:
    w, grad, reply = np.zeros(DIM), np.empty(DIM), np.empty(DIM + 1)
    updates = dict.fromkeys(range(1, world.size), 0)
    stopped: set[int] = set()
    while len(stopped) < len(updates):
        worker = await world.recv(grad, src=None, tag=PUSH)  # whichever worker is ready first
        w -= LR * grad
        updates[worker] += 1
        if sum(updates.values()) >= UPDATES:
            stopped.add(worker)  # its pull says stop; the others are served until they push again
        reply[:DIM], reply[DIM] = w, worker in stopped
        await world.send(reply, dst=worker, tag=PULL)
    return {"weights": w, "updates": updates}


async def work(world) -> dict:
    x, y = shard(world.rank)
    w, reply, pushes = np.zeros(DIM), np.empty(DIM + 1), 0
    while True:
        await asyncio.sleep(0.001 * world.rank)  # workers of different speeds
        await world.send(x.T @ (x @ w - y) / len(y), dst=0, tag=PUSH)
        await world.recv(reply, src=0, tag=PULL)
        pushes += 1
        w = reply[:DIM].copy()
        if reply[DIM]:
            return {"weights": w, "pushes": pushes}


async def rank_main(world) -> dict:
    return await (serve(world) if world.rank == 0 else work(world))


def main() -> None:
    ray.init(num_cpus=RANKS)
    with ray_world(RANKS, strategy="SPREAD") as world:
        server, *workers = world.run(rank_main)
    target = np.random.default_rng(0).normal(size=DIM)
    error = float(np.abs(server["weights"] - target).max())
    pushes = {rank: out["pushes"] for rank, out in enumerate(workers, start=1)}
    assert server["updates"] == pushes, (server["updates"], pushes)  # every gradient applied once
    assert error < 1e-6, error
    print(f"server applied {sum(pushes.values())} gradients from workers {pushes}; "
          f"distance to the target {error:.1e}")


if __name__ == "__main__":
    main()

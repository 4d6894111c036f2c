#!/usr/bin/env python
"""The await API: two ranks in one event loop play ping-pong over real sockets.

Each rank is a full asyncdist rank (its own engine and authenticated TCP
connections); ``asyncio.gather`` runs both. The same coroutine works
unchanged when each rank is its own process (``init_world("env://")``).

    python examples/async_ping_pong.py
"""
import asyncio

import numpy as np

import asyncdist
from asyncdist import HashStore


async def player(world: asyncdist.ProcessGroup, rounds: int) -> float:
    ball = np.zeros(1)
    other = 1 - world.rank
    for _ in range(rounds):
        if world.rank == 0:
            await world.send(ball + 1, dst=other)
            await world.recv(ball, src=other)
        else:
            await world.recv(ball, src=other)
            await world.send(ball + 1, dst=other)
    return float(ball[0])


async def main() -> None:
    store = HashStore()
    worlds = await asyncio.gather(*(asyncdist.init_world(store=store, rank=r, world_size=2) for r in range(2)))
    try:
        scores = await asyncio.gather(*(player(w, rounds=100) for w in worlds))
        print(f"after 100 rounds: rank 0 holds {scores[0]:g}, rank 1 holds {scores[1]:g}")
    finally:
        await asyncio.gather(*(w.close() for w in worlds))


if __name__ == "__main__":
    asyncio.run(main())

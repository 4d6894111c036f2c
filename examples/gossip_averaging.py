#!/usr/bin/env python
"""The await API: gossip averaging that overlaps communication with compute.

Every rank holds a vector. In each round the ranks pair up at random (the
same seeded permutation on every rank, so they agree without talking; with an
odd number of ranks one sits the round out), and each pair swaps vectors and
takes their average. A rank starts its exchange (``isend`` and ``irecv``
return Works at once), runs its local compute step in a thread while the
bytes move, and only then awaits the Works. Pairwise averaging keeps the
global mean and shrinks the spread around it: after ``ROUNDS`` rounds every
rank checks that it is within ``EPS`` of the exact mean, computed once with
``all_reduce``. No collective runs during the rounds: each rank waits only
for its partner of the round.

    python examples/gossip_averaging.py                                # 5 ranks in one loop
    asyncdist-run --nproc-per-node 3 examples/gossip_averaging.py      # one process per rank
"""
import asyncio
import os

import numpy as np

import asyncdist
from asyncdist.testing import local_world

DIM, ROUNDS, EPS, SEED = 10_000, 100, 1e-9, 1234


def partner(rank: int, size: int, round_: int) -> int | None:
    """This round's partner of ``rank``: neighbours in a permutation all ranks agree on."""
    order = np.random.default_rng([SEED, round_]).permutation(size)
    position = int(np.flatnonzero(order == rank)[0])
    return int(order[position ^ 1]) if position ^ 1 < size else None


def local_step(state: np.ndarray) -> np.ndarray:
    """Stands in for a training step: CPU-bound NumPy work, which releases the GIL."""
    # Element-wise, so single-threaded: a BLAS product here, running on every
    # core from several ranks' threads at once, made the run 7 times slower.
    return np.tanh(np.sin(state) * 2.0 + state * 0.5)


async def rank_main(world: asyncdist.ProcessGroup) -> None:
    rng = np.random.default_rng(world.rank)
    x = rng.normal(loc=world.rank, scale=10.0, size=DIM)
    mean = x.copy()
    await world.all_reduce(mean)
    mean /= world.size  # the exact answer, to check the gossip against
    state, theirs = rng.normal(size=10_000), np.empty(DIM)
    for round_ in range(ROUNDS):
        peer = partner(world.rank, world.size, round_)
        exchange = []
        if peer is not None:  # 1. start the exchange: both calls return at once
            exchange = [world.isend(x, dst=peer, tag=round_), world.irecv(theirs, src=peer, tag=round_)]
        # 2. compute in a thread while the loop moves the messages
        state = await asyncio.to_thread(local_step, state)
        if exchange:  # 3. only now wait for the partner's vector
            await asyncio.gather(*exchange)
            x = (x + theirs) / 2  # a new array: the x being sent was never touched
    spread = np.array([np.abs(x - mean).max()])
    await world.all_reduce(spread, op=asyncdist.ReduceOp.MAX)
    if spread[0] > EPS:
        raise RuntimeError(f"rank {world.rank}: still {spread[0]:.1e} from the mean after {ROUNDS} rounds")
    print(f"rank {world.rank}: every rank within {spread[0]:.1e} of the global mean "
          f"after {ROUNDS} rounds\n", end="", flush=True)


async def main() -> None:
    if "RANK" in os.environ:  # started by asyncdist-run: this process is one rank
        async with await asyncdist.init_world() as world:
            await rank_main(world)
    else:  # every rank in this event loop, over real sockets
        async with local_world(5) as worlds:
            await asyncio.gather(*(rank_main(w) for w in worlds))


if __name__ == "__main__":
    asyncio.run(main())

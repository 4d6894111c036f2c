"""A data-parallel training script for the namespaced multi-node launch test.

Run by ``asyncdist-run`` on every node: full-batch gradient descent on a
least-squares problem, each rank's gradient from its own rows, averaged with
``all_reduce`` (the blocking facade). Prints ``weights <rank> <step> <weights as
JSON>`` every ``EVERY`` steps and ``final <rank> <weights>`` at the end;
on a failure, ``error <type> lost=<rank> <message>`` and exit status 1. With
``hold``, a failed rank then waits to be stopped (SIGTERM) instead of exiting,
so that every other rank learns of the failure from its own heartbeat or a
relayed abort (which name the lost rank), not from this rank's goodbye.

    asyncdist-run --nnodes 3 --node-rank i --nproc-per-node 2 \\
        --master-addr 10.231.0.1 --master-port 29500 netns_train.py STEPS [hold]
"""

from __future__ import annotations

import json
import sys
import threading

import numpy as np

import asyncdist as dist

ROWS, DIM, LR = 96, 5, 0.1
EVERY = 300


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    x = rng.normal(size=(ROWS, DIM))
    return x, x @ rng.normal(size=DIM) + 0.1 * rng.normal(size=ROWS)


def train(steps: int, rank: int, size: int) -> np.ndarray:
    x, y = data()
    mine = slice(rank * ROWS // size, (rank + 1) * ROWS // size)  # equal shards: ROWS % size == 0
    w = np.zeros(DIM)
    for step in range(steps):
        grad = x[mine].T @ (x[mine] @ w - y[mine]) / ROWS  # this shard's part of the mean's gradient
        dist.all_reduce(grad)
        w -= LR * grad
        if (step + 1) % EVERY == 0:
            print(f"weights {rank} {step + 1} {json.dumps(w.tolist())}", flush=True)
    return w


def main() -> int:
    dist.init_process_group()
    rank, size = dist.get_rank(), dist.get_world_size()
    try:
        w = train(int(sys.argv[1]), rank, size)
    except dist.DistError as exc:
        print(f"error {type(exc).__name__} lost={getattr(exc, 'rank', None)} {exc}", flush=True)
        if sys.argv[2:] == ["hold"]:
            threading.Event().wait()  # until the test stops the launcher
        return 1
    print(f"final {rank} {json.dumps(w.tolist())}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

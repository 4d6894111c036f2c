"""A rank that waits until the test stops rank 1: ``python interrupt_main.py p2p|collective``.

Joins by env://, prints ``ready`` once joined, then waits on rank 1, which
never answers: with ``p2p`` every rank receives from the next one (which
never sends); with ``collective`` rank 1 waits in such a receive while the
others run an all_reduce, which needs rank 1. Rank 1 is the one the test
signals, and it ends; the others print ``{"error": ..., "message": ...}`` for
the call that failed.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta

import numpy as np

import asyncdist as dist

dist.init_process_group(timeout=timedelta(seconds=30))
rank, size = dist.get_rank(), dist.get_world_size()
print("ready", flush=True)
try:
    if sys.argv[1] == "collective" and rank != 1:
        dist.all_reduce(np.ones(4))
    else:
        dist.recv(np.zeros(1), (rank + 1) % size)
except Exception as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
dist.destroy_process_group()

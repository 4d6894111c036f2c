"""A rank that waits in a receive until the test stops it: ``python interrupt_main.py``.

Joins by env://, prints ``ready`` once joined, then every rank receives from
the next one (which never sends). The rank the test signals ends; the others
print ``{"error": ..., "message": ...}`` for the receive that failed.
"""

from __future__ import annotations

import json
from datetime import timedelta

import numpy as np

import asyncdist as dist

dist.init_process_group(timeout=timedelta(seconds=30))
rank, size = dist.get_rank(), dist.get_world_size()
print("ready", flush=True)
try:
    dist.recv(np.zeros(1), (rank + 1) % size)
except Exception as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
dist.destroy_process_group()

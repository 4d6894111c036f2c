"""One rank started by a launcher (a real ``mpirun``, or SLURM's variables):
where it sits, as asyncdist.rendezvous.environments reads it, and one all_reduce.

Started by tests/rendezvous/test_launched_ranks.py; joins through the store at
``ASYNCDIST_STORE_ADDR`` (served by the test) with ``init_process_group()``
and no rank or size given, and prints one JSON line.
"""

from __future__ import annotations

import json

import numpy as np

import asyncdist as dist
from asyncdist.rendezvous.environments import local_rank_from_env, placement

found = placement()
assert found is not None, "no launcher variables"
dist.init_process_group()
x = np.arange(4.0) + dist.get_rank()
dist.all_reduce(x)
print(json.dumps({"source": found.source, "rank": dist.get_rank(), "size": dist.get_world_size(),
                  "local_rank": local_rank_from_env(), "local_size": found.local_world_size, "sum": x.tolist()}),
      flush=True)
dist.destroy_process_group()

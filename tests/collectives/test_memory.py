"""An all_reduce of S bytes uses at most about S bytes of extra memory per rank.

Measured in each rank process with tracemalloc (NumPy reports its array
allocations to it), around one large all_reduce after a warm-up call, on
both payload paths: by memory between processes of one host, and inline.
"""

from __future__ import annotations

import numpy as np
import pytest

from asyncdist.testing import spawn

SIZE = 16 << 20  # bytes: ring-sized, 16 chunks per rank pair
ALLOWED = 1.1 * SIZE  # "about S": S plus a tenth for headers, views and bookkeeping


def _all_reduce_peak(nbytes: int) -> tuple[int, bool]:
    """Extra bytes allocated at the peak of one all_reduce, and whether its result is right."""
    import tracemalloc

    import asyncdist as dist

    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    data = np.empty(nbytes // 4, np.float32)
    data[:] = rank + 1
    dist.all_reduce(data)  # warm-up: first-call allocations are not the algorithm's
    data[:] = np.arange(data.size, dtype=np.float32) % 7 + rank
    dist.barrier()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    dist.all_reduce(data)
    peak = tracemalloc.get_traced_memory()[1] - before
    tracemalloc.stop()
    expected = (np.arange(data.size, dtype=np.float32) % 7) * world + sum(range(world))
    correct = bool(np.array_equal(data, expected))
    dist.destroy_process_group()
    return peak, correct


@pytest.mark.parametrize(
    ("n", "by_memory"), [(2, "1"), (4, "1"), (2, "0")], ids=["2-ranks-by-memory", "4-ranks-by-memory", "2-ranks-inline"]
)
def test_all_reduce_peak_memory_is_about_its_size(n: int, by_memory: str) -> None:
    results = spawn(n, _all_reduce_peak, SIZE, env={"ASYNCDIST_CMA": by_memory})
    for rank, (peak, correct) in enumerate(results):
        assert correct, f"rank {rank}: wrong all_reduce result"
        assert peak <= ALLOWED, f"rank {rank} allocated {peak / SIZE:.2f} S at the peak of an all_reduce of S bytes"

"""``python -m asyncdist.bench.nccl_overhead``: what asyncdist's NCCL path costs per call.

One process, one GPU, one-rank communicators (so the figure is the
software's, not the network's). Each path times ``--iters`` blocking
``all_reduce`` calls of a small float32 array, each followed by a
synchronisation of the device, after ``--warmup`` calls:

* ``cupy-nccl``: ``cupy.cuda.nccl.NcclCommunicator.allReduce`` on a CuPy
  array, then ``stream.synchronize()``: the floor;
* ``asyncdist``: the blocking facade with ``init_process_group("nccl")`` on
  a torch CUDA tensor, then ``torch.cuda.synchronize()``;
* ``asyncdist-cupy``: the same facade call on a CuPy array;
* ``torch-nccl``: ``torch.distributed`` with its NCCL backend, for scale.

The report is the median microseconds per call and each path's excess over
the floor: the wrapper's cost (taking a call number, ordering after the
caller's stream, issuing on the communicator's stream, polling its event
from the loop). Needs CUDA, CuPy and torch.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from typing import Any, Callable

from .cuda_staging import median_seconds

__all__ = ["main"]


def _cupy_floor(elements: int, warmup: int, iters: int) -> float:
    import cupy
    from cupy.cuda import nccl

    comm = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
    x = cupy.ones(elements, cupy.float32)
    stream = cupy.cuda.Stream(non_blocking=True)

    def call() -> None:
        comm.allReduce(x.data.ptr, x.data.ptr, elements, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr)

    try:
        return median_seconds(call, stream.synchronize, warmup, iters)
    finally:
        comm.destroy()


def _asyncdist(array: Any, sync: Callable[[], Any], warmup: int, iters: int, store: str) -> float:
    """The facade on a one-rank NCCL group; one group per array library (a
    communicator serves the library it was made for)."""
    import asyncdist as dist

    dist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        dist.all_reduce(array)
        sync()
        if not bool((array == 1).all()):
            raise AssertionError("asyncdist: a one-rank all_reduce changed its input")
        return median_seconds(lambda: dist.all_reduce(array), sync, warmup, iters)
    finally:
        dist.destroy_process_group()


def _torch_nccl(elements: int, warmup: int, iters: int, store: str) -> float:
    import torch
    import torch.distributed as tdist

    tdist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1,
                             device_id=torch.device("cuda", 0))
    try:
        tensor = torch.ones(elements, device="cuda")
        return median_seconds(lambda: tdist.all_reduce(tensor), torch.cuda.synchronize, warmup, iters)
    finally:
        tdist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m asyncdist.bench.nccl_overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=2, help="float32 elements per call (default 2: 8 bytes)")
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--iters", type=int, default=2000)
    args = parser.parse_args(argv)
    import torch

    torch.cuda.set_device(0)
    import cupy

    n, warmup, iters = args.elements, args.warmup, args.iters
    seconds = {"cupy-nccl": _cupy_floor(n, warmup, iters)}
    with tempfile.TemporaryDirectory() as tmp:
        seconds["asyncdist"] = _asyncdist(torch.ones(n, device="cuda"), torch.cuda.synchronize, warmup, iters,
                                          os.path.join(tmp, "a"))
        seconds["asyncdist-cupy"] = _asyncdist(cupy.ones(n, cupy.float32), cupy.cuda.Device().synchronize, warmup,
                                               iters, os.path.join(tmp, "c"))
        seconds["torch-nccl"] = _torch_nccl(n, warmup, iters, os.path.join(tmp, "t"))
    floor = seconds["cupy-nccl"]
    print(f"one-rank NCCL all_reduce of {args.elements * 4} B, {torch.cuda.get_device_name(0)}, median of {args.iters}")
    print(f"{'path':<16}{'us/call':>10}{'over cupy-nccl':>16}")
    for path, value in seconds.items():
        print(f"{path:<16}{value * 1e6:>10.1f}{(value - floor) * 1e6:>+16.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

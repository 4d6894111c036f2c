"""Benchmark: all_reduce of one CUDA tensor, asyncdist's paths against torch's.

``python -m asyncdist.bench.cuda_staging`` starts ``--world-size`` rank
processes on this host per path and times a blocking ``all_reduce`` of one
``--bytes``-sized float32 CUDA tensor, followed by ``torch.cuda.synchronize()``
(so a path that returns before the device is done is not flattered). Paths:

* ``asyncdist``: asyncdist's pinned staging (``init_process_group("gloo")``);
* ``gloo``: torch.distributed's gloo, which stages CUDA tensors too;
* ``asyncdist-nccl``: asyncdist on NCCL through CuPy (``backend="nccl"``);
* ``nccl``: torch.distributed's NCCL.

Ranks use GPU ``rank % device_count``; the NCCL paths need a GPU per rank
and are skipped otherwise. Each rank checks one all_reduce against the
expected sum before timing. The report gives the median time per call and
the bus bandwidth ``2 (n-1)/n * bytes / time``, as nccl-tests does.
``--device cpu`` runs the same on CPU tensors (a smoke test of this script).

This module stands apart from the sweep CLI (:mod:`asyncdist.bench.cli`):
it needs CUDA, and its rows are one size, one op.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Protocol, Sequence

from ..testing.spawn import spawn

__all__ = ["main", "PATHS"]

#: path -> (library, backend name)
PATHS = {"asyncdist": ("asyncdist", "gloo"), "gloo": ("torch", "gloo"), "asyncdist-nccl": ("asyncdist", "nccl"), "nccl": ("torch", "nccl")}


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B")
    return int(float(text[:-1]) * units[text[-1]]) if text and text[-1] in units else int(text)


class _Distributed(Protocol):
    """What a rank uses of torch.distributed, and of asyncdist alike (the modules)."""

    def init_process_group(self, backend: str, *, init_method: str, rank: int, world_size: int) -> Any: ...
    def all_reduce(self, tensor: Any) -> Any: ...
    def barrier(self) -> Any: ...
    def destroy_process_group(self) -> Any: ...


def _rank(path: str, store_file: str, device_kind: str, nbytes: int, warmup: int, iters: int) -> dict[str, Any]:
    """One rank of one path (runs in a spawned process)."""
    import torch

    library, backend = PATHS[path]
    d: _Distributed
    if library == "torch":
        import torch.distributed as torch_distributed

        d = torch_distributed
    else:
        import asyncdist

        d = asyncdist
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    sync: Callable[[], None]
    if device_kind == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        sync = torch.cuda.synchronize
    else:
        device, sync = torch.device("cpu"), (lambda: None)
    d.init_process_group(backend, init_method=f"file://{store_file}", rank=rank, world_size=n)
    try:
        x = torch.full((nbytes // 4,), float(rank + 1), device=device)
        d.all_reduce(x)
        sync()
        if not bool((x == n * (n + 1) / 2).all()):
            raise AssertionError(f"{path}: rank {rank} got a wrong sum")
        x.zero_()  # repeated sums of zeros never overflow
        for _ in range(warmup):
            d.all_reduce(x)
        sync()
        d.barrier()
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            d.all_reduce(x)
            sync()
            times.append(time.perf_counter() - start)
    finally:
        d.destroy_process_group()
    return {"median_s": statistics.median(times), "min_s": min(times)}


def run(path: str, world_size: int, device_kind: str, nbytes: int, warmup: int, iters: int, timeout: float) -> dict[str, Any]:
    """Time ``path`` on ``world_size`` fresh rank processes; the slowest rank's median counts."""
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        results = spawn(world_size, _rank, path, store, device_kind, nbytes, warmup, iters, timeout=timeout)
    seconds = max(r["median_s"] for r in results)
    busbw = 2 * (world_size - 1) / world_size * nbytes / seconds / 1e9 if world_size > 1 else 0.0
    return {"path": path, "world_size": world_size, "device": device_kind, "bytes": nbytes, "iters": iters,
            "median_ms": seconds * 1e3, "algbw_GBps": nbytes / seconds / 1e9, "busbw_GBps": busbw}


def _available(path: str, world_size: int, device_kind: str) -> str | None:
    """Why ``path`` cannot run here, or None."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return "needs torch"
    if device_kind == "cpu":
        return "NCCL needs CUDA" if PATHS[path][1] == "nccl" else None
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device"
    if PATHS[path][1] == "nccl":
        if torch.cuda.device_count() < world_size:
            return f"NCCL needs a GPU per rank ({torch.cuda.device_count()} for {world_size} ranks)"
        if path == "asyncdist-nccl" and importlib.util.find_spec("cupy") is None:
            return "needs CuPy"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m asyncdist.bench.cuda_staging", description=__doc__.split("\n\n")[0])
    p.add_argument("--world-size", type=int, default=2, help="rank processes per path (default 2)")
    p.add_argument("--bytes", type=_size, default=64 << 20, help="tensor size, e.g. 64M (default 64M)")
    p.add_argument("--paths", default="asyncdist,gloo", help=f"comma-separated, of {', '.join(PATHS)} (default asyncdist,gloo)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: a smoke run on CPU tensors")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one path may take")
    p.add_argument("--json", metavar="FILE", help="also write the rows as JSON ('-': stdout)")
    args = p.parse_args(argv)
    paths = [s.strip() for s in args.paths.split(",") if s.strip()]
    unknown = [s for s in paths if s not in PATHS]
    if unknown:
        p.error(f"unknown path(s) {unknown}; choose from {list(PATHS)}")
    rows = []
    print(f"all_reduce of {args.bytes} bytes (float32), {args.world_size} ranks, {args.device} tensors")
    print(f"{'path':<16}{'median ms':>12}{'algbw GB/s':>12}{'busbw GB/s':>12}")
    for path in paths:
        why = _available(path, args.world_size, args.device)
        if why is not None:
            print(f"{path:<16}  skipped: {why}")
            continue
        row = run(path, args.world_size, args.device, args.bytes, args.warmup, args.iters, args.timeout)
        rows.append(row)
        print(f"{path:<16}{row['median_ms']:>12.3f}{row['algbw_GBps']:>12.2f}{row['busbw_GBps']:>12.2f}", flush=True)
    if args.json:
        text = json.dumps(rows, indent=1)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: collectives on CUDA tensors, asyncdist's paths against torch's.

``python -m asyncdist.bench.cuda_staging`` starts ``--world-size`` rank
processes on this host per path and times, for each of ``--ops`` and each of
``--bytes``, a blocking call on float32 CUDA tensors followed by
``torch.cuda.synchronize()`` (so a path that returns before the device is
done is not flattered). Paths:

* ``asyncdist``: asyncdist's blocking facade, pinned staging (``init_process_group("gloo")``);
* ``gloo``: torch.distributed's gloo, which stages CUDA tensors too;
* ``asyncdist-torch``: torch.distributed over asyncdist's torch backend
  (``init_process_group("asyncdist")``), pinned staging underneath;
* ``asyncdist-nccl``: asyncdist on NCCL through CuPy (``backend="nccl"``);
* ``nccl``: torch.distributed's NCCL.

Ops: ``all_reduce``, ``broadcast`` (root 0) and ``all_gather`` (each rank's
input is ``bytes``), and ``ddp``: one training step of the MLP of
:mod:`asyncdist.bench.ddp` (``bytes`` of float32 parameters) under
DistributedDataParallel, on the torch.distributed paths only.

Ranks use GPU ``rank % device_count``; the NCCL paths need a GPU per rank
and are skipped otherwise. Each rank checks one call of each op against the
expected values before timing it. The report gives the median time per
call (the slowest rank's) and the bus bandwidth as nccl-tests defines it
(all_reduce ``2 (n-1)/n``, all_gather ``(n-1)/n`` of the gathered bytes,
broadcast ``1`` times the algorithm bandwidth). ``--device cpu`` runs the
same on CPU tensors (a smoke test of this script).

This module stands apart from the sweep CLI (:mod:`asyncdist.bench.cli`):
it needs CUDA, and it runs every op and size in one start of the ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from types import ModuleType
from typing import Any, Callable, Collection, Sequence

from .. import settings
from ..testing.spawn import spawn
from .cases import CASES, Point
from .ddp import TrainingStep, build_step
from .plan import parse_bytes

__all__ = ["main", "median_seconds", "PATHS", "OPS"]

#: path -> (library, backend name)
PATHS = {"asyncdist": ("asyncdist", "gloo"), "gloo": ("torch", "gloo"), "asyncdist-torch": ("torch", "asyncdist"),
         "asyncdist-nccl": ("asyncdist", "nccl"), "nccl": ("torch", "nccl")}
OPS = ("all_reduce", "broadcast", "all_gather", "ddp")


def _sizes(text: str) -> list[int]:
    try:
        return [parse_bytes(part.strip()) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _bus_factor(op: str, n: int) -> float:
    """nccl-tests' bus bandwidth over algorithm bandwidth, as the sweep's rows have it (0: none)."""
    factor = CASES[op].bus_factor
    return factor(n) if factor is not None else 0.0


def _call_and_check(d: Any, op: str, nbytes: int, rank: int, n: int, device: Any) -> tuple[Callable[[], Any], int]:
    """One checked call of ``op``; returns the call to time, and the bytes algbw counts."""
    import torch

    count = max(1, nbytes // 4)
    if op == "ddp":
        (step,) = build_step(d, Point(rank, n, count, "float32", "torch"), device=device)
        assert isinstance(step, TrainingStep)
        step()
        weight = next(iter(step.model.parameters())).detach()
        checksums = [torch.zeros(1, dtype=torch.float64, device=device) for _ in range(n)]
        d.all_gather(checksums, weight.double().sum().reshape(1))
        if len({float(c) for c in checksums}) != 1:
            raise AssertionError(f"ddp: rank {rank}: the ranks' weights differ after a step")
        return step, nbytes
    x = torch.full((count,), float(rank + 1), device=device)
    if op == "all_reduce":
        d.all_reduce(x)
        expected = torch.full_like(x, n * (n + 1) / 2)
        if not torch.equal(x, expected):
            raise AssertionError(f"{op}: rank {rank} got a wrong sum")
        x.zero_()  # repeated sums of zeros never overflow
        return (lambda: d.all_reduce(x)), count * 4
    if op == "broadcast":
        d.broadcast(x, 0)
        if not bool((x == 1.0).all()):
            raise AssertionError(f"{op}: rank {rank} got a wrong value")
        return (lambda: d.broadcast(x, 0)), count * 4
    outputs = [torch.empty_like(x) for _ in range(n)]
    d.all_gather(outputs, x)
    if not all(bool((out == float(r + 1)).all()) for r, out in enumerate(outputs)):
        raise AssertionError(f"{op}: rank {rank} got wrong values")
    return (lambda: d.all_gather(outputs, x)), count * 4 * n


def median_seconds(call: Callable[[], Any], sync: Callable[[], Any], warmup: int, iters: int,
                   before: Callable[[], Any] | None = None) -> float:
    """Median seconds of ``call(); sync()`` over ``iters``, after ``warmup`` calls
    and ``before()`` (a barrier, so that every rank starts timing together)."""
    for _ in range(warmup):
        call()
    sync()
    if before is not None:
        before()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _rank(path: str, store_file: str, device_kind: str, cases: list[tuple[str, int]], warmup: int,
          iters: int) -> list[dict[str, Any]]:
    """One rank of one path: every case in turn (runs in a spawned process)."""
    import torch

    library, backend = PATHS[path]
    d: ModuleType  # torch.distributed, or asyncdist's facade of the same functions
    if library == "torch":
        import torch.distributed as torch_distributed

        if backend == "asyncdist":
            import asyncdist.torch_backend  # noqa: F401 (registers the backend, as its entry point does)
        d = torch_distributed
    else:
        import asyncdist

        d = asyncdist
    rank, n = int(settings.current().environ["RANK"]), int(settings.current().environ["WORLD_SIZE"])
    sync: Callable[[], None]
    if device_kind == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        sync = torch.cuda.synchronize
    else:
        device, sync = torch.device("cpu"), (lambda: None)
    d.init_process_group(backend, init_method=f"file://{store_file}", rank=rank, world_size=n)
    results = []
    try:
        for op, nbytes in cases:
            call, moved = _call_and_check(d, op, nbytes, rank, n, device)
            seconds = median_seconds(call, sync, warmup, iters, before=d.barrier)
            results.append({"op": op, "bytes": nbytes, "moved": moved, "median_s": seconds})
    finally:
        d.destroy_process_group()
    return results


def run(path: str, world_size: int, device_kind: str, cases: list[tuple[str, int]], warmup: int, iters: int,
        timeout: float) -> list[dict[str, Any]]:
    """Time ``path`` on ``world_size`` fresh rank processes; the slowest rank's median counts."""
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        per_rank = spawn(world_size, _rank, path, store, device_kind, cases, warmup, iters, timeout=timeout)
    rows = []
    for index, (op, nbytes) in enumerate(cases):
        seconds = max(results[index]["median_s"] for results in per_rank)
        algbw = per_rank[0][index]["moved"] / seconds / 1e9
        rows.append({"path": path, "op": op, "world_size": world_size, "device": device_kind, "bytes": nbytes,
                     "iters": iters, "median_ms": seconds * 1e3, "algbw_GBps": algbw,
                     "busbw_GBps": algbw * _bus_factor(op, world_size)})
    return rows


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
    p.add_argument("--bytes", type=_sizes, default=[64 << 20], help="tensor sizes, e.g. 1M,16M,64M (default 64M)")
    p.add_argument("--ops", default="all_reduce", help=f"comma-separated, of {', '.join(OPS)} (default all_reduce)")
    p.add_argument("--paths", default="asyncdist,gloo", help=f"comma-separated, of {', '.join(PATHS)} (default asyncdist,gloo)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: a smoke run on CPU tensors")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one path may take")
    p.add_argument("--json", metavar="FILE", help="also write the rows as JSON ('-': stdout)")
    args = p.parse_args(argv)
    paths, ops = _names(p, args.paths, PATHS, "path"), _names(p, args.ops, OPS, "op")
    rows = []
    print(f"{', '.join(ops)} of float32 tensors, {args.world_size} ranks, {args.device} tensors")
    print(f"{'path':<16}{'op':<12}{'bytes':>10}{'median ms':>12}{'algbw GB/s':>12}{'busbw GB/s':>12}")
    for path in paths:
        why = _available(path, args.world_size, args.device)
        if why is not None:
            print(f"{path:<16}  skipped: {why}")
            continue
        path_ops = ops if PATHS[path][0] == "torch" else [op for op in ops if op != "ddp"]  # DDP is torch's
        cases = [(op, nbytes) for op in path_ops for nbytes in args.bytes]
        for row in run(path, args.world_size, args.device, cases, args.warmup, args.iters, args.timeout):
            rows.append(row)
            print(f"{path:<16}{row['op']:<12}{row['bytes']:>10}{row['median_ms']:>12.3f}{row['algbw_GBps']:>12.2f}"
                  f"{row['busbw_GBps']:>12.2f}", flush=True)
    if args.json:
        text = json.dumps(rows, indent=1)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    return 0


def _names(parser: argparse.ArgumentParser, text: str, known: Collection[str], what: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in names if s not in known]
    if unknown:
        parser.error(f"unknown {what}(s) {unknown}; choose from {list(known)}")
    return names


if __name__ == "__main__":
    sys.exit(main())

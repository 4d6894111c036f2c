"""``python -m asyncdist.bench.recorder``: what the flight recorder costs per call, end to end.

Two ranks (processes of this host, the blocking facade) run blocks of
8-byte all_reduces. Both switch their recorder on (2000 entries) and off (0)
at the same block boundaries, alternating which comes first, so each on/off
pair is timed within milliseconds in the same processes: the machine's
drift, which is larger than the figure, cancels in the difference. Rank 0
prints the median of the paired differences and their quartiles; the
garbage collector is off while timing, as its pauses would land in either
half of a pair at random.

Apart from ``asyncdist-bench`` because it switches the recorder inside one
run, which the sweep's separate runs (one per setting) cannot do.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

__all__ = ["main"]


def _pairs(block: int, pairs: int) -> dict[str, float]:
    import torch

    import asyncdist as dist
    from asyncdist.facade.lifecycle import _world

    dist.init_process_group()
    recorder = _world().engine.flight.recorder
    capacity = recorder.capacity
    x = torch.ones(2)
    for _ in range(block):  # warm-up
        dist.all_reduce(x)
    on: list[float] = []
    off: list[float] = []
    gc.disable()
    try:
        for i in range(pairs):
            times = {}
            for setting in (capacity, 0) if i % 2 == 0 else (0, capacity):
                recorder.capacity = setting
                dist.barrier()
                start = time.perf_counter()
                for _ in range(block):
                    dist.all_reduce(x)
                times[setting] = (time.perf_counter() - start) / block * 1e6
            on.append(times[capacity])
            off.append(times[0])
    finally:
        gc.enable()
        recorder.capacity = capacity
        dist.destroy_process_group()
    differences = sorted(a - b for a, b in zip(on, off))
    quarter = len(differences) // 4
    return {"on_us": statistics.median(on), "off_us": statistics.median(off),
            "difference_us": statistics.median(differences),
            "q1_us": differences[quarter], "q3_us": differences[-1 - quarter]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m asyncdist.bench.recorder", description=__doc__.splitlines()[0])
    parser.add_argument("--block", type=int, default=1000, help="all_reduces per timed block (default 1000)")
    parser.add_argument("--pairs", type=int, default=21, help="on/off pairs (default 21)")
    args = parser.parse_args(argv)
    from ..testing import spawn

    result = spawn(2, _pairs, args.block, args.pairs, timeout=600)[0]
    print(f"facade 8 B all_reduce, 2 ranks: recorder on {result['on_us']:.2f} us, off {result['off_us']:.2f} us; "
          f"paired difference {result['difference_us']:+.2f} us (quartiles {result['q1_us']:+.2f} to {result['q3_us']:+.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``python -m asyncdist.bench.recorder``: what the flight recorder costs per call, end to end.

Two ranks (processes of this host, the blocking facade) run blocks of
8-byte all_reduces. Both switch their recorder on (2000 entries) and off (0)
at the same block boundaries, alternating which comes first, so each on/off
pair is timed within milliseconds in the same processes: the machine's
drift, which is larger than the figure, cancels in the difference. The
report pools both ranks' pairs: the medians of the two settings, the median
of the paired differences and their quartiles, and the mean difference with
a 95 % bootstrap interval (on a noisy machine, ask for many short pairs,
``--block 250 --pairs 151``, and read the interval). The garbage collector
is off while timing, as its pauses would land in either half of a pair at
random.

Apart from ``asyncdist-bench`` because it switches the recorder inside one
run, which the sweep's separate runs (one per setting) cannot do.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

__all__ = ["main", "summary"]


def _pairs(block: int, pairs: int) -> dict[str, list[float]]:
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
    return {"on_us": on, "off_us": off}


def summary(on: list[float], off: list[float], resamples: int = 2000) -> dict[str, float]:
    """The figures of paired timings (us per call): medians, the median paired
    difference and its quartiles, the mean difference and its 95 % bootstrap interval."""
    import numpy as np

    differences = np.sort(np.subtract(on, off))
    quarter = len(differences) // 4
    means = np.random.default_rng(0).choice(differences, (resamples, len(differences))).mean(axis=1)
    return {"on_us": statistics.median(on), "off_us": statistics.median(off),
            "difference_us": float(np.median(differences)),
            "q1_us": float(differences[quarter]), "q3_us": float(differences[-1 - quarter]),
            "mean_us": float(differences.mean()),
            "low_us": float(np.percentile(means, 2.5)), "high_us": float(np.percentile(means, 97.5))}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m asyncdist.bench.recorder", description=__doc__.splitlines()[0])
    parser.add_argument("--block", type=int, default=1000, help="all_reduces per timed block (default 1000)")
    parser.add_argument("--pairs", type=int, default=21, help="on/off pairs (default 21)")
    args = parser.parse_args(argv)
    from ..testing import spawn

    ranks = spawn(2, _pairs, args.block, args.pairs, timeout=600)
    result = summary([t for r in ranks for t in r["on_us"]], [t for r in ranks for t in r["off_us"]])
    print(f"facade 8 B all_reduce, 2 ranks: recorder on {result['on_us']:.2f} us, off {result['off_us']:.2f} us; "
          f"paired difference {result['difference_us']:+.2f} us (quartiles {result['q1_us']:+.2f} to {result['q3_us']:+.2f}); "
          f"mean {result['mean_us']:+.2f} us (95 % interval {result['low_us']:+.2f} to {result['high_us']:+.2f}), "
          f"{2 * args.pairs} pairs of both ranks")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``python -m asyncdist.bench.recorder``: what the flight recorder costs per call, end to end.

Two ranks run blocks of 8-byte all_reduces with their recorder on (2000
entries) and off (0), switched at the same block boundaries, alternating
which comes first, so each on/off pair is timed within milliseconds in
the same processes: the machine's drift, which is larger than the figure,
cancels in the difference. The report: the medians of the two settings,
the median of the paired differences and their quartiles, and the mean
difference with a 95 % bootstrap interval. The garbage collector is off
while timing, as its pauses would land in either half of a pair at random.

Two ways to time it:

* by default, the blocking facade, a process per rank, wall-clock time per
  call (both ranks' pairs pooled): the latency a user sees. On a noisy
  machine ask for many short pairs (``--block 250 --pairs 151``) and read
  the interval, which is 1-2 us wide on a 2-core VM.
* ``--cpu``: the await API, both ranks in one event loop of this process,
  the thread's CPU time per call and rank. Nothing else runs in those
  blocks and a preempted thread is not charged, so the interval is about
  five times narrower; it counts the recorder's work, not where in the
  call it falls.

Apart from ``asyncdist-bench`` because it switches the recorder inside one
run, which the sweep's separate runs (one per setting) cannot do.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from typing import Callable

__all__ = ["main", "summary"]


def _paired(pairs: int, block_us: Callable[[bool], float]) -> dict[str, list[float]]:
    """``pairs`` on/off pairs of ``block_us(recording)`` (us per call), which
    setting first alternating, with the garbage collector off."""
    on: list[float] = []
    off: list[float] = []
    gc.disable()
    try:
        for i in range(pairs):
            order = (True, False) if i % 2 == 0 else (False, True)
            times = {recording: block_us(recording) for recording in order}
            on.append(times[True])
            off.append(times[False])
    finally:
        gc.enable()
    return {"on_us": on, "off_us": off}


def _switch(recorders: list, ring: str | None) -> Callable[[bool | None], None]:
    """Turns ``recorders`` on (a ring of their capacity) or off (a ring of
    none), or with None back to the rings they had. ``ring``: "native" or
    "python" for rings of that kind, None for the kind they have."""
    from ..flight.record_ring import PyRecordRing, RecordRing

    kind = {None: None, "native": RecordRing, "python": PyRecordRing}[ring]
    if ring == "native" and RecordRing is PyRecordRing:
        raise SystemExit("the C ring was not built at install: no native ring to time")
    had = [recorder.ring for recorder in recorders]
    on = [(kind or type(r.ring))(r.capacity, r.ops) for r in recorders]
    off = [(kind or type(r.ring))(0, r.ops) for r in recorders]

    def set_recording(recording: bool | None) -> None:
        for recorder, chosen in zip(recorders, had if recording is None else on if recording else off):
            recorder.ring = chosen

    return set_recording


def _facade_pairs(block: int, pairs: int, ring: str | None = None) -> dict[str, list[float]]:
    """One rank's pairs: the blocking facade, wall-clock time per call."""
    import torch

    import asyncdist as dist
    from asyncdist.facade.lifecycle import _world

    dist.init_process_group()
    set_recording = _switch([_world().engine.flight.recorder], ring)
    x = torch.ones(2)

    def block_us(recording: bool) -> float:
        set_recording(recording)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(block):
            dist.all_reduce(x)
        return (time.perf_counter() - start) / block * 1e6

    try:
        block_us(True)  # warm-up
        return _paired(pairs, block_us)
    finally:
        set_recording(None)
        dist.destroy_process_group()


def _cpu_pairs(block: int, pairs: int, ring: str | None = None) -> dict[str, list[float]]:
    """Both ranks in one event loop: the thread's CPU time per call and rank."""
    from ..testing import local_world

    loop = asyncio.new_event_loop()
    world = local_world(2)
    try:
        groups = loop.run_until_complete(world.__aenter__())
        try:
            return _paired_in_loop(loop, groups, block, pairs, ring)
        finally:
            loop.run_until_complete(world.__aexit__(None, None, None))
    finally:
        loop.close()


def _paired_in_loop(
    loop: asyncio.AbstractEventLoop, groups: list, block: int, pairs: int, ring: str | None
) -> dict[str, list[float]]:
    """The pairs of :func:`_cpu_pairs`, the world started on ``loop``."""
    import numpy as np

    set_recording = _switch([group.engine.flight.recorder for group in groups], ring)
    tensors = [np.ones(2, np.float32) for _ in groups]

    async def calls() -> None:
        for _ in range(block):
            await asyncio.gather(*(group.all_reduce(x) for group, x in zip(groups, tensors)))

    def block_us(recording: bool) -> float:
        set_recording(recording)
        start = time.thread_time()
        loop.run_until_complete(calls())
        return (time.thread_time() - start) / (len(groups) * block) * 1e6

    try:
        block_us(True)  # warm-up
        return _paired(pairs, block_us)
    finally:
        set_recording(None)


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
    parser.add_argument("--cpu", action="store_true",
                        help="time CPU per call and rank, both ranks in one loop (the await API)")
    parser.add_argument("--ring", choices=("native", "python"),
                        help="time this kind of ring (default: the installed one, native where it was built)")
    args = parser.parse_args(argv)
    if args.cpu:
        times = _cpu_pairs(args.block, args.pairs, args.ring)
        what, count = "await API 8 B all_reduce, 2 ranks in one loop, CPU time per call and rank", args.pairs
    else:
        from ..testing import spawn

        ranks = spawn(2, _facade_pairs, args.block, args.pairs, args.ring, timeout=600)
        times = {key: [t for rank in ranks for t in rank[key]] for key in ("on_us", "off_us")}
        what, count = "facade 8 B all_reduce, 2 ranks", 2 * args.pairs
    result = summary(times["on_us"], times["off_us"])
    print(f"{what}: recorder on {result['on_us']:.2f} us, off {result['off_us']:.2f} us; "
          f"paired difference {result['difference_us']:+.2f} us (quartiles {result['q1_us']:+.2f} to {result['q3_us']:+.2f}); "
          f"mean {result['mean_us']:+.2f} us (95 % interval {result['low_us']:+.2f} to {result['high_us']:+.2f}), "
          f"{count} pairs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

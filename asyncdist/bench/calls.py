"""``python -m asyncdist.bench.calls`` (``asyncdist-bench --count-calls``): the Python work per operation, counted.

Times on a shared machine wander; the number of Python functions an
operation enters does not. This counts them with ``sys.setprofile``
(:class:`~asyncdist.bench.call_counter.CallCounter`): two ranks of the await
API in one event loop of this process, asyncio's and (where installed)
uvloop's, each counted apart (the harness's
:func:`~asyncdist.testing.local_world`, real connections between them), and
after a warm-up, ``--iters`` of each operation in a counted window, each
iteration the ranks' calls gathered and awaited together:

* ``all_reduce``: 8 B (two float32) on each rank; ``broadcast``: 8 B from
  rank 0; ``barrier``; counted per rank (the window's count / iterations / 2);
* ``send+recv``: rank 0 sends 8 B, rank 1 receives them; counted per pair,
  both ends together;
* ``(harness)``: the gather of two coroutines that return at once, per rank:
  the share of each row that is this benchmark's, not the operation's.

Python calls are ``"call"`` events, split by where the entered function's
code lives (asyncdist, asyncio, other: the rest of the standard library,
NumPy, and this benchmark's driving loop); a coroutine resumed counts as
entered again. C calls (``"c_call"``) are counted apart. "Files" is the
number of distinct asyncdist source files entered by one operation (a
window of one iteration). The garbage collector is off in the windows, so a
collection's finalizers land in none. Each row is counted ``--rounds``
times; the table shows the median round and the least total, which agree
but for a rare timer (a heartbeat) firing in a window.

Last, one blocking ``dist.all_reduce`` of an 8 B tensor (torch's where
installed, else NumPy's) on a world of two processes (:func:`~asyncdist.testing.spawn`),
counted in rank 0 on every thread, and the asyncdist files it entered
(``--no-facade`` leaves it out). Whether the peer's message is there
already when the call starts depends on how the processes interleave, and
changes the path: 25 back-to-back calls are counted one by one, and the
least and median counts are reported, and the files every call entered
and those only some did.

Only the public await API, the facade and the harness are used, so the
same command counts any version of the library: the one imported (printed
first) is the one counted.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import threading
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from .. import settings
from .call_counter import ORIGINS, CallCounter

__all__ = ["OpCounts", "OPS", "LOOPS", "available_loops", "count_ops", "count_facade_all_reduce", "table",
           "facade_lines", "main"]

#: The event loops the rows can be counted on, and what each is to asyncdist.
#: asyncio's loop runs its own machinery in Python (a loop turn, a callback
#: scheduled, a timer: each some Python calls); uvloop's is C.
LOOPS = {
    "asyncio": "asyncio's event loop (the facade's)",
    "uvloop": "uvloop (the await API's default where installed)",
}


def available_loops() -> list[str]:
    """The loops of :data:`LOOPS` installed here."""
    import importlib.util

    return [name for name in LOOPS if name == "asyncio" or importlib.util.find_spec(name) is not None]

#: One iteration's coroutines, given both ranks' groups and arrays.
Iteration = Callable[[list, list], list[Awaitable[Any]]]

#: The operations counted, by row name: their iteration, and what a count is per.
OPS: dict[str, tuple[Iteration, str]] = {
    "all_reduce 8 B": (lambda g, x: [g[0].all_reduce(x[0]), g[1].all_reduce(x[1])], "rank"),
    "broadcast 8 B (root 0)": (lambda g, x: [g[0].broadcast(x[0], 0), g[1].broadcast(x[1], 0)], "rank"),
    "barrier": (lambda g, x: [g[0].barrier(), g[1].barrier()], "rank"),
    "send+recv 8 B": (lambda g, x: [g[0].send(x[0], 1), g[1].recv(x[1], 0)], "pair"),
}


async def _nothing() -> None:
    return None


#: The row of the benchmark's own share: two coroutines that return at once, gathered.
HARNESS = "(harness)"
_ALL: dict[str, tuple[Iteration, str]] = {**OPS, HARNESS: (lambda g, x: [_nothing(), _nothing()], "rank")}


@dataclass(frozen=True, slots=True)
class OpCounts:
    """One row: an operation's counts per rank (or per send/recv pair), each
    round's and the median round's.

    ``calls``: the median round's Python calls by origin; ``totals``: every
    round's total Python calls; ``c_calls``: the median round's C calls;
    ``files``: asyncdist files entered by one operation (median of rounds).
    """

    op: str
    per: str
    calls: dict[str, float]
    totals: tuple[float, ...]
    c_calls: float
    files: int

    @property
    def total(self) -> float:
        """The median round's Python calls."""
        return sum(self.calls.values())


def _window(loop: asyncio.AbstractEventLoop, iteration: Callable[[], list[Awaitable[Any]]], iters: int) -> CallCounter:
    """Counts ``iters`` iterations, each ``iteration()``'s coroutines gathered."""

    async def repeat() -> None:
        for _ in range(iters):
            await asyncio.gather(*iteration())

    counter = CallCounter()
    task = repeat()
    gc.disable()
    try:
        with counter:
            loop.run_until_complete(task)
    finally:
        gc.enable()
    return counter


def _rounds(loop: asyncio.AbstractEventLoop, groups: list, arrays: list, iters: int, rounds: int) -> dict[str, OpCounts]:
    per_round: dict[str, list[tuple[dict[str, float], float, int]]] = {op: [] for op in _ALL}
    for _ in range(rounds):
        for op, (make, per) in _ALL.items():
            share = iters * (len(groups) if per == "rank" else 1)
            counter = _window(loop, lambda: make(groups, arrays), iters)
            calls = {k: v / share for k, v in counter.by_origin().items()}
            files = len(_window(loop, lambda: make(groups, arrays), 1).library_files())
            per_round[op].append((calls, sum(counter.c_calls.values()) / share, files))
    rows = {}
    for op, results in per_round.items():
        totals = tuple(sum(calls.values()) for calls, _, _ in results)
        calls, c_calls, _ = results[totals.index(statistics.median_low(totals))]
        files = int(statistics.median_low(f for _, _, f in results))
        rows[op] = OpCounts(op, _ALL[op][1], calls, totals, c_calls, files)
    return rows


def count_ops(iters: int = 200, rounds: int = 3, warmup: int = 50, loop: str = "asyncio") -> dict[str, OpCounts]:
    """Count every row of :data:`OPS` and the harness's; blocks (runs its own loop).

    Args:
        iters: iterations of each operation per counted window.
        rounds: windows per operation; the median round is reported.
        warmup: iterations of each operation before the first window.
        loop: the event loop to count on, a key of :data:`LOOPS`.

    Returns:
        The rows by operation name, the harness's last.
    """
    import numpy as np

    from ..testing import local_world

    running: asyncio.AbstractEventLoop
    if loop == "uvloop":
        import uvloop

        running = uvloop.new_event_loop()
    else:
        running = asyncio.new_event_loop()
    world = local_world(2)
    try:
        groups = running.run_until_complete(world.__aenter__())
        try:
            # zeros: sums stay 0, so no overflow warning ever enters a window
            arrays = [np.zeros(2, np.float32) for _ in groups]
            for make, _ in _ALL.values():
                running.run_until_complete(_warm(make, groups, arrays, warmup))
            return _rounds(running, groups, arrays, iters, rounds)
        finally:
            running.run_until_complete(world.__aexit__(None, None, None))
    finally:
        running.close()


async def _warm(make: Iteration, groups: list, arrays: list, iters: int) -> None:
    for _ in range(iters):
        await asyncio.gather(*make(groups, arrays))


def _facade_rank(warmup: int, calls: int) -> list[dict[str, Any]] | None:
    """In each rank process: warm up, then ``calls`` blocking all_reduces, each
    counted alone in rank 0."""
    import asyncdist as dist

    x: Any
    try:
        import torch

        x, kind = torch.zeros(2), "torch"
    except ImportError:
        import numpy as np

        x, kind = np.zeros(2, np.float32), "NumPy"
    rank = int(settings.current().environ["RANK"])
    if rank == 0:
        counting = CallCounter()
        counting.profile_new_threads()  # the loop's thread, started by init_process_group
    try:
        dist.init_process_group()
        for _ in range(warmup):
            dist.all_reduce(x)
        dist.barrier()
        if rank != 0:
            for _ in range(calls):
                dist.all_reduce(x)
            return None
        counted = []
        gc.disable()
        for _ in range(calls):
            counting.calls.clear()
            counting.c_calls.clear()
            with counting:
                dist.all_reduce(x)
            counted.append({"files": counting.library_files(), "calls": counting.by_origin(),
                            "c_calls": sum(counting.c_calls.values()), "tensor": kind})
        gc.enable()
        return counted
    finally:
        threading.setprofile(None)
        dist.destroy_process_group()


def count_facade_all_reduce(warmup: int = 50, calls: int = 25) -> dict[str, Any]:
    """``calls`` blocking ``dist.all_reduce`` calls of 8 B on two processes, each
    counted alone in rank 0 (on every thread).

    How the two processes' steps interleave decides a call's path (the peer's
    message there already, or waited for), so calls differ: the least and the
    median are reported, and the files every call entered and those some did.

    Returns:
        ``totals`` (every call's Python calls, sorted); ``median`` (the median
        call's Python calls by origin, and its C calls as ``"c_calls"``);
        ``every`` and ``some`` (asyncdist files entered by every call, and by
        some but not all, sorted); ``tensor`` (``"torch"`` or ``"NumPy"``).
    """
    from ..testing import spawn

    counted = sorted(spawn(2, _facade_rank, warmup, calls, timeout=300)[0], key=lambda c: sum(c["calls"].values()))
    median = counted[(len(counted) - 1) // 2]
    every = set.intersection(*(set(c["files"]) for c in counted))
    some = set.union(*(set(c["files"]) for c in counted)) - every
    return {"totals": [sum(c["calls"].values()) for c in counted], "median": {**median["calls"], "c_calls": median["c_calls"]},
            "every": sorted(every), "some": sorted(some), "tensor": median["tensor"]}


def table(rows: dict[str, OpCounts]) -> list[str]:
    """The rows as a Markdown table."""
    lines = ["| operation | per | Python calls | " + " | ".join(ORIGINS) + " | least round | C calls | asyncdist files |",
             "|---|---|---:|" + "---:|" * len(ORIGINS) + "---:|---:|---:|"]
    for r in rows.values():
        split = " | ".join(f"{r.calls[o]:.1f}" for o in ORIGINS)
        lines.append(f"| {r.op} | {r.per} | {r.total:.1f} | {split} | {min(r.totals):.1f} | {r.c_calls:.1f} | {r.files} |")
    return lines


def facade_lines(result: dict[str, Any]) -> list[str]:
    """The facade calls' counts, then the files they entered, one per line."""
    totals, median = result["totals"], result["median"]
    split = ", ".join(f"{o} {median[o]}" for o in ORIGINS)
    return [f"facade dist.all_reduce, 8 B {result['tensor']} tensor, 2 processes, rank 0, all threads, "
            f"{len(totals)} calls counted one by one: Python calls per call least {totals[0]}, "
            f"median {totals[(len(totals) - 1) // 2]} ({split}; {median['c_calls']} C calls)",
            f"asyncdist files entered by one call: {len(result['every'])} by every call, "
            f"{len(result['some'])} more by some",
            *(f"  {f}" for f in result["every"]),
            *(f"  {f} (some calls)" for f in result["some"])]


def main(argv: list[str] | None = None) -> int:
    """Count and print the table (and the facade's files); returns 0."""
    parser = argparse.ArgumentParser(prog="python -m asyncdist.bench.calls", description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=200, help="iterations per counted window (default 200)")
    parser.add_argument("--rounds", type=int, default=3, help="counted windows per operation (default 3)")
    parser.add_argument("--warmup", type=int, default=50, help="iterations of each operation first (default 50)")
    parser.add_argument("--no-facade", action="store_true", help="leave out the facade all_reduce's files")
    args = parser.parse_args(argv)
    if args.iters < 1 or args.rounds < 1 or args.warmup < 0:
        parser.error("--iters and --rounds must be >= 1, --warmup >= 0")
    import asyncdist

    print(f"asyncdist {os.path.dirname(asyncdist.__file__)}, Python {sys.version.split()[0]}; "
          f"2 ranks in one loop, {args.iters} iterations x {args.rounds} rounds after {args.warmup} warm-up")
    for loop in available_loops():
        print(f"\n{LOOPS[loop]}:")
        print("\n".join(table(count_ops(args.iters, args.rounds, args.warmup, loop))))
    if not args.no_facade:
        print()
        print("\n".join(facade_lines(count_facade_all_reduce(args.warmup))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

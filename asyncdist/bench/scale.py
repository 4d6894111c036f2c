"""``asyncdist-bench --scale 8,16,32,64``: messages, bytes and time per call as n grows.

Many ranks do not fit on one machine's cores as processes, but they fit in
one event loop: :func:`asyncdist.testing.local_world` starts ``n`` ranks in
this process, connected over real loopback sockets, and one call of a
collective is every rank's call gathered. The loop runs on one core, so the
time per call is the whole group's work (every message's cost, every byte
copied), not the latency a group of processes would see; what it shows is
how that work grows with n.

The messages and bytes each rank sends are counted exactly, by the engine's
own counters (``ProcessGroup.stats()``, :mod:`asyncdist.flight.counters`):
zeroed before one call and read after it (the counts are deterministic, the
times are not). They are every message the call puts on the wire, so a
rooted call's announcements count too (no payload: the root sends one to
each other member, see :mod:`asyncdist.group.calls`). The table gives the
most any rank sent, in messages and as a multiple of the message size, and
the time per call (median of :data:`REPS` repetitions).
"""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import numpy as np

from ..testing.world import local_world
from .plan import format_bytes

__all__ = ["ScaleRow", "measure", "table", "SCALE_OPS", "REPS"]

REPS = 7
SCALE_OPS = ("all_reduce", "broadcast")


@dataclass(frozen=True, slots=True)
class ScaleRow:
    """One (op, size, n): the most any rank sent, and the time per call."""

    op: str
    nbytes: int
    n: int
    messages: int  # the most messages any rank sent in one call
    sent: float  # the most bytes any rank sent in one call, over the message size
    total_messages: int  # messages of the whole group in one call
    ms_per_call: float


def _sent(stats: dict[str, Any]) -> tuple[int, int]:
    """Messages and payload bytes one rank sent, over all its peers (a ``ProcessGroup.stats()``)."""
    peers = stats["peers"].values()
    return sum(p["sent_messages"] for p in peers), sum(p["sent_bytes"] for p in peers)


async def _measure(op: str, nbytes: int, n: int) -> ScaleRow:
    count = max(1, nbytes // 4)
    async with local_world(n, timeout=600) as ranks:
        bufs = [np.ones(count, np.float32) for _ in range(n)]

        def call() -> Any:
            if op == "all_reduce":
                return asyncio.gather(*(g.all_reduce(bufs[g.rank]) for g in ranks))
            return asyncio.gather(*(g.broadcast(bufs[g.rank], 0) for g in ranks))

        await call()  # warm-up: connections, scratch buffers
        for g in ranks:
            g.stats(reset=True)
        await call()
        messages, sent = zip(*(_sent(g.stats()) for g in ranks))
        times = []
        for _ in range(REPS):
            start = perf_counter()
            await call()
            times.append(perf_counter() - start)
    return ScaleRow(op, count * 4, n, max(messages), max(sent) / (count * 4), sum(messages),
                    statistics.median(times) * 1e3)


def measure(op: str, nbytes: int, ns: list[int]) -> list[ScaleRow]:
    """One row per n in ``ns`` (blocks; runs its own event loop).

    Args:
        op: one of :data:`SCALE_OPS`.
        nbytes: the message size (float32 elements, at least one).
    """
    from ..loop.choice import new_event_loop

    loop = new_event_loop()
    try:
        return [loop.run_until_complete(_measure(op, nbytes, n)) for n in ns]
    finally:
        loop.close()


def table(rows: list[ScaleRow]) -> list[str]:
    """The rows as a Markdown table."""
    lines = ["| op | size | n | messages per rank | bytes per rank (x size) | time per call (ms) | time per message (us) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        per_message = r.ms_per_call * 1e3 / r.total_messages if r.total_messages else 0.0
        lines.append(f"| {r.op} | {format_bytes(r.nbytes)} | {r.n} | {r.messages} | {r.sent:.2f} "
                     f"| {r.ms_per_call:.1f} | {per_message:.1f} |")
    return lines

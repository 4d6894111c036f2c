"""``asyncdist-bench --scale 8,16,32,64``: messages, bytes and time per call as n grows.

Many ranks do not fit on one machine's cores as processes, but they fit in
one event loop: :func:`asyncdist.testing.local_world` starts ``n`` ranks in
this process, connected over real loopback sockets, and one call of a
collective is every rank's call gathered. The loop runs on one core, so the
time per call is the whole group's work (every message's cost, every byte
copied), not the latency a group of processes would see; what it shows is
how that work grows with n.

The messages and bytes each rank sends are counted exactly: for the span of
one call, :meth:`asyncdist.engine.channel.Channel.start_send` is wrapped to
count them per rank (the counts are deterministic, the times are not). The
table gives the most any rank sent, in messages and as a multiple of the
message size, and the time per call (median of :data:`REPS` repetitions).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import numpy as np

from ..engine.channel import Channel
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


@contextlib.contextmanager
def _counting() -> Iterator[tuple[Counter[int], Counter[int]]]:
    messages: Counter[int] = Counter()
    sent: Counter[int] = Counter()
    start_send = Channel.start_send

    def counted(self: Channel, buf: Any, peer: int) -> Any:
        messages[self.rank] += 1
        sent[self.rank] += buf.nbytes
        return start_send(self, buf, peer)

    Channel.start_send = counted  # type: ignore[method-assign]
    try:
        yield messages, sent
    finally:
        Channel.start_send = start_send  # type: ignore[method-assign]


async def _measure(op: str, nbytes: int, n: int) -> ScaleRow:
    count = max(1, nbytes // 4)
    async with local_world(n, timeout=600) as ranks:
        bufs = [np.ones(count, np.float32) for _ in range(n)]

        def call() -> Any:
            if op == "all_reduce":
                return asyncio.gather(*(g.all_reduce(bufs[g.rank]) for g in ranks))
            return asyncio.gather(*(g.broadcast(bufs[g.rank], 0) for g in ranks))

        await call()  # warm-up: connections, scratch buffers
        with _counting() as (messages, sent):
            await call()
        times = []
        for _ in range(REPS):
            start = perf_counter()
            await call()
            times.append(perf_counter() - start)
    return ScaleRow(op, count * 4, n, max(messages.values(), default=0), max(sent.values(), default=0) / (count * 4),
                    sum(messages.values()), statistics.median(times) * 1e3)


def measure(op: str, nbytes: int, ns: list[int]) -> list[ScaleRow]:
    """One row per n in ``ns`` (blocks; runs its own event loop).

    Args:
        op: one of :data:`SCALE_OPS`.
        nbytes: the message size (float32 elements, at least one).
    """
    from ..loop.thread import new_event_loop

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

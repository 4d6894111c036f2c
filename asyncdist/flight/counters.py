"""Live counters: bytes and messages per peer, operations by kind, time in them.

``group.stats()`` / ``dist.get_stats()`` read them; ``asyncdist-bench --stats``
prints them per row. Per-peer traffic is counted where every message passes
(the engine's send, each connection's inbox): two list increments, no
allocation. Operations and the time spent in them are counted by the flight
recorder's ring as each ends, into the counter of its description
(:mod:`asyncdist.flight.record_ring`), so they need the recorder on
(``ASYNCDIST_TRACE_BUFFER`` > 0).

Loop thread only (a reader on another thread gets a moment-stale copy).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from .descriptions import Description

__all__ = ["Counters"]


class Counters:
    """Traffic per peer (global ranks) since the start or the last :meth:`reset`.

    Attributes:
        sent_bytes, sent_messages, received_bytes, received_messages: per
            global rank (payload bytes; messages with or without payload).
        ops: context -> description -> [count, seconds from posted to ended]
            (filled by the recorder; a reset zeroes the counters in place, as
            records of operations still open hold them).
    """

    __slots__ = ("sent_bytes", "sent_messages", "received_bytes", "received_messages", "ops")

    def __init__(self, world_size: int) -> None:
        self.sent_bytes = [0] * world_size
        self.sent_messages = [0] * world_size
        self.received_bytes = [0] * world_size
        self.received_messages = [0] * world_size
        self.ops: dict[int, dict[Description, list]] = {}

    def widen(self, world_size: int) -> None:
        """Count for the ids below ``world_size`` too (processes a grow admitted)."""
        for counts in (self.sent_bytes, self.sent_messages, self.received_bytes, self.received_messages):
            counts.extend([0] * (world_size - len(counts)))

    def reset(self) -> None:
        """Start counting from zero."""
        for counts in (self.sent_bytes, self.sent_messages, self.received_bytes, self.received_messages):
            counts[:] = [0] * len(counts)
        for stats in self.ops.values():
            for stat in stats.values():
                stat[:] = [0, 0.0]

    def snapshot(
        self, peers: Iterable[int], contexts: Iterable[int], same_host: Callable[[int], bool]
    ) -> dict[str, Any]:
        """The counts of ``peers`` (global ranks) and of the operations of ``contexts``, as a dict.

        Returns:
            ``{"peers": {rank: {"sent_bytes", "sent_messages", "received_bytes",
            "received_messages", "same_host"}}, "ops": {name: {"count", "seconds"}},
            "wait_seconds": total, "same_host_bytes": ..., "socket_bytes": ...}``
        """
        per_peer: dict[int, dict[str, Any]] = {}
        split = {True: 0, False: 0}
        for rank in peers:
            local = same_host(rank)
            per_peer[rank] = {
                "sent_bytes": self.sent_bytes[rank], "sent_messages": self.sent_messages[rank],
                "received_bytes": self.received_bytes[rank], "received_messages": self.received_messages[rank],
                "same_host": local,
            }  # fmt: skip
            split[local] += self.sent_bytes[rank] + self.received_bytes[rank]
        ops: dict[str, dict[str, Any]] = {}
        for ctx in contexts:
            for desc, (count, seconds) in list(self.ops.get(ctx, {}).items()):
                if not count:  # none since the last reset
                    continue
                stat = ops.setdefault(desc.op, {"count": 0, "seconds": 0.0})
                stat["count"] += count
                stat["seconds"] += seconds
        return {
            "peers": per_peer, "ops": ops, "wait_seconds": sum(s["seconds"] for s in ops.values()),
            "same_host_bytes": split[True], "socket_bytes": split[False],
        }  # fmt: skip

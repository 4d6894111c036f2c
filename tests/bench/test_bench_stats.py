"""``asyncdist-bench --stats``: rank 0's counters reach each row, printed per call."""

from __future__ import annotations

from asyncdist.bench.cli import build_parser
from asyncdist.bench.loops import Sample
from asyncdist.bench.plan import SERIES, Job, Plan
from asyncdist.bench.report import stats_lines
from asyncdist.bench.runner import combine

# Rank 0's counters over 2 repetitions of 4 calls of an 8 B all_reduce of 2 ranks.
STATS = {
    "peers": {1: {"sent_bytes": 64, "sent_messages": 8, "received_bytes": 64, "received_messages": 8,
                  "same_host": True}},
    "ops": {"all_reduce": {"count": 8, "seconds": 0.0016}, "barrier": {"count": 2, "seconds": 0.0004}},
    "wait_seconds": 0.002, "same_host_bytes": 128, "socket_bytes": 0,
}


def test_the_counters_of_rank_0_are_printed_per_call() -> None:
    assert build_parser().parse_args(["--stats"]).stats
    plan = Plan(world_size=2, dtype="float32", array="numpy", jobs=(Job("all_reduce", 2),), reps=2, stats=True)
    (row,) = combine(SERIES["await"], plan, [[Sample(4, (1e-4, 1e-4), stats=STATS)], [Sample(4, (1e-4, 1e-4))]])
    assert row.stats is STATS
    assert stats_lines([row])[-1] == (
        "#   all_reduce 8 (asyncdist): sent 8 B in 1 messages, received 8 B; ops all_reduce x1, barrier x0.25; "
        "in them 250.0 us; same host 16 B, socket 0 B"
    )

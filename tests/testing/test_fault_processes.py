"""Each kind of fault of a plan, applied to rank processes (``spawn(n, fn, faults=...)``).

The same plans as ``test_fault_injection.py``, by the processes' own means:
a kill is a real SIGKILL, a pause a real SIGSTOP and SIGCONT; links are held
by each process's gates. Heartbeats are short (50 ms pings, 250 ms timeout).
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import asyncdist as dist
from asyncdist.errors import AsyncDistError, PeerLostError
from asyncdist.testing import spawn
from asyncdist.testing.faults import FaultPlan
from asyncdist.testing.injector import RankKilled, install, uninstall

HEARTBEAT = {"ASYNCDIST_HEARTBEAT_INTERVAL": "0.05", "ASYNCDIST_HEARTBEAT_TIMEOUT": "0.25"}
TIMEOUT = 30


def sums(count, size=4):
    """``count`` all_reduces of ``rank + 1``: the sums and seconds of those that completed, then the error."""
    dist.init_process_group()
    done = []
    try:
        for _ in range(count):
            x = np.full(size, float(dist.get_rank() + 1))
            start = time.monotonic()
            dist.all_reduce(x)
            done.append((float(x[0]), time.monotonic() - start))
    except AsyncDistError as exc:
        return [s for s, _ in done], (type(exc).__name__, getattr(exc, "rank", None)), [t for _, t in done]
    return [s for s, _ in done], None, [t for _, t in done]


def pairs():
    """Exchange with the partner on this side of a 0,1|2,3 partition, then with one across."""
    dist.init_process_group()
    rank, got = dist.get_rank(), []
    try:
        for peer in (rank ^ 1, rank ^ 2):
            out, x = np.array([float(rank)]), np.zeros(1)
            work = dist.isend(out, peer)
            dist.recv(x, peer)
            work.wait()
            got.append(float(x[0]))
    except PeerLostError as exc:
        return got, exc.rank
    return got, None


def test_kill_is_a_sigkill_at_the_kth_all_reduce() -> None:
    results = spawn(3, sums, 4, faults="kill 2 at all_reduce#3", env=HEARTBEAT, timeout=TIMEOUT)
    assert results[2] == RankKilled(2, "SIGKILL")
    assert [r[:2] for r in results[:2]] == [([6.0, 6.0], ("PeerLostError", 2))] * 2


def test_a_short_pause_is_a_sigstop_that_only_delays() -> None:
    results = spawn(3, sums, 3, faults="pause 1 at all_reduce#2 for 300ms", env=HEARTBEAT | {
        "ASYNCDIST_HEARTBEAT_TIMEOUT": "2"}, timeout=TIMEOUT)  # fmt: skip
    assert [r[:2] for r in results] == [([6.0] * 3, None)] * 3
    assert all(times[1] >= 0.3 for _, _, times in results)  # the second waited for the stopped rank


def test_a_long_pause_gets_the_stopped_process_excluded() -> None:
    results = spawn(3, sums, 3, faults="pause 1 at all_reduce#2 for 1s", env=HEARTBEAT, timeout=TIMEOUT)
    assert [r[:2] for r in results] == [
        ([6.0], ("PeerLostError", 1)), ([6.0], ("RankExcludedError", None)), ([6.0], ("PeerLostError", 1))]


def test_a_delayed_link_holds_every_message() -> None:
    results = spawn(2, sums, 3, faults="delay 0-1 50ms", env=HEARTBEAT, timeout=TIMEOUT)
    assert [r[:2] for r in results] == [([3.0] * 3, None)] * 2
    assert all(t >= 0.05 for _, _, times in results for t in times)


def test_a_slow_link_carries_its_rate() -> None:
    n = 50_000  # float64: 400 kB, each rank sends at least half of it
    results = spawn(2, sums, 1, n, faults="slow 0-1 2MB/s", timeout=TIMEOUT)
    assert [r[:2] for r in results] == [([3.0], None)] * 2
    assert all(times[0] >= (n * 8 / 2) / 2e6 for _, _, times in results)


def test_a_cut_link_loses_both_sides_after_the_heartbeat_timeout() -> None:
    start = time.monotonic()
    results = spawn(2, sums, 3, faults="cut 0-1 at all_reduce#2 for 10s", env=HEARTBEAT, timeout=TIMEOUT)
    assert [r[:2] for r in results] == [([3.0], ("PeerLostError", 1)), ([3.0], ("PeerLostError", 0))]
    assert time.monotonic() - start < 10  # the heartbeat's verdict, long before the heal


def test_a_cut_shorter_than_the_heartbeat_heals() -> None:
    results = spawn(2, sums, 3, faults="cut 0-1 at all_reduce#2 for 100ms", env=HEARTBEAT, timeout=TIMEOUT)
    assert [r[:2] for r in results] == [([3.0] * 3, None)] * 2
    assert all(times[1] >= 0.1 for _, _, times in results)


def test_a_partition_cuts_only_between_its_sides() -> None:
    results = spawn(4, pairs, faults="partition 0,1|2,3 at send#1 for 10s", env=HEARTBEAT, timeout=TIMEOUT)
    assert results == [([1.0], 2), ([0.0], 3), ([3.0], 0), ([2.0], 1)]


def test_a_refused_rank_cannot_join() -> None:
    with pytest.raises(PeerLostError, match="refused") as info:
        spawn(3, sums, 1, faults="refuse 2", env=HEARTBEAT, timeout=TIMEOUT)
    assert "(raised on rank 2 of 3)" in info.value.__notes__
    assert "fault plan: refuse 2" in info.value.__notes__


def test_spawn_runs_the_plan_installed_in_its_process() -> None:
    install(FaultPlan.parse("kill 1 at all_reduce#2"))  # as the pytest plugin's marker does
    try:
        results = spawn(2, sums, 3, env=HEARTBEAT, timeout=TIMEOUT)
    finally:
        uninstall()
    assert results[1] == RankKilled(1, "SIGKILL") and results[0][:2] == ([3.0], ("PeerLostError", 1))

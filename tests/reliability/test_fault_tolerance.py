"""Fault tolerance with real processes: SIGKILL, and SIGSTOP shorter and longer than the heartbeat timeout.

The ranks (``ft_main.py``) run all_reduce rounds and, on an error, revoke,
agree and shrink, as docs/fault-tolerance.md shows. A rank killed with
SIGKILL is left out by every survivor, all of whom end in the same group;
the time from the kill until each survivor's first right all_reduce in the
new group is printed (``pytest -s``). A rank paused for less than the
heartbeat timeout is kept; one paused for longer is dropped, and when it
wakes it learns so (RankExcludedError) instead of going on alone.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

FT_MAIN = Path(__file__).with_name("ft_main.py")
RECOVER_SECONDS = 5.0  # from SIGKILL to every survivor working in the new group (a reset is seen at once)


def _ready(job) -> None:
    for rank in range(job.n):
        job.next_event(rank, ["ready"])


@pytest.mark.parametrize("victim", [0, 2], ids=["coordinator", "other"])
def test_sigkill_survivors_shrink_and_go_on(rank_job, victim: int) -> None:
    job = rank_job(4, ["0", "20"], script=FT_MAIN)  # rounds until the kill, then 20 in the new group
    _ready(job)
    job.set("go")
    time.sleep(0.3)  # let the rounds run
    killed = job.signal(victim, signal.SIGKILL)
    survivors = [r for r in range(4) if r != victim]
    took = {}
    for rank in survivors:
        assert job.next_event(rank, ["shrunk"])["ranks"] == survivors
        took[rank] = job.next_event(rank, ["working"])["t"] - killed
        done = job.next_event(rank, ["done"])
        assert (done["agreed"], done["ranks"], done["failed"]) == (1, survivors, [])
    assert all(0 <= t < RECOVER_SECONDS for t in took.values()), took
    print(f"\n[recover] SIGKILL of rank {victim} of 4 -> working in the new group: "
          + ", ".join(f"rank {r} {t * 1000:.0f} ms" for r, t in sorted(took.items())))


def _paused(rank_job, interval: str, timeout: str, rounds: str):
    """Three ranks with these heartbeat settings, rank 1 stopped as the rounds begin."""
    env = {"ASYNCDIST_HEARTBEAT_INTERVAL": interval, "ASYNCDIST_HEARTBEAT_TIMEOUT": timeout}
    job = rank_job(3, [rounds, "10"], script=FT_MAIN, env=env)
    _ready(job)
    job.signal(1, signal.SIGSTOP)
    job.set("go")
    return job


def test_a_rank_paused_within_the_heartbeat_timeout_is_kept(rank_job) -> None:
    job = _paused(rank_job, "0.5", "3", "100")
    time.sleep(1.0)  # the pause itself: a third of the heartbeat timeout
    job.signal(1, signal.SIGCONT)
    for rank in range(3):
        done = job.next_event(rank, ["done", "shrunk", "excluded"])
        assert (done["event"], done["agreed"], done["ranks"], done["failed"]) == ("done", 1, [0, 1, 2], []), done


def test_a_rank_paused_past_the_heartbeat_timeout_is_dropped_and_told(rank_job) -> None:
    job = _paused(rank_job, "0.25", "1", "0")
    for rank in (0, 2):
        assert job.next_event(rank, ["shrunk"])["ranks"] == [0, 2]
        done = job.next_event(rank, ["done"])
        assert (done["agreed"], done["ranks"], done["failed"]) == (1, [0, 2], [])
    job.signal(1, signal.SIGCONT)
    excluded = job.next_event(1, ["excluded", "done", "shrunk"])
    assert excluded["event"] == "excluded", excluded
    assert excluded["message"].startswith("rank 1 was excluded from the job by rank "), excluded

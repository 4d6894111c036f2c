"""Dead peers: a rank that dies mid-operation fails what depends on it, fast.

The process tests start real ranks (``rank_main.py``), kill one with SIGKILL
in the middle of an operation, and check that every rank whose operation
depended on it raised PeerLostError naming it within DETECT_SECONDS of the
kill, through the blocking facade and the await API, and that the ranks not
involved carry on. Detection times are printed (``pytest -s``) and quoted in
docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import signal
import time

import numpy as np
import pytest

from asyncdist.errors import PeerLostError
from asyncdist.testing import local_world

DETECT_SECONDS = 5.0
VICTIM, LATE = 3, 2


def _detected(job, rank: int, start: float, victim: int) -> float:
    event = job.next_event(rank, ["error", "done"], timeout=30)
    assert event["event"] == "error", f"rank {rank} did not fail: {event}"
    assert event["type"] == "PeerLostError" and event["lost"] == victim, event
    assert f"rank {victim}" in event["message"], event
    took = event["t"] - start
    assert 0 <= took < DETECT_SECONDS, (rank, took, event)
    return took


@pytest.mark.parametrize(("api", "count"), [("facade", 16), ("await", 16), ("facade", 1 << 20)],
                         ids=["facade-doubling", "await-doubling", "facade-ring-8MiB"])
def test_sigkill_mid_all_reduce_fails_every_member_fast(rank_job, api: str, count: int) -> None:
    # Ranks 0, 1 and the victim enter the all_reduce, which cannot finish
    # without rank LATE; so the victim dies mid-call, with messages exchanged.
    job = rank_job(4, ["all_reduce", api, str(VICTIM), str(LATE), str(count)])
    for rank in (0, 1, VICTIM):
        job.next_event(rank, ["entered"])
    job.next_event(VICTIM, ["stalled"])
    time.sleep(0.3)  # let the exchanges that can happen, happen
    killed = job.signal(VICTIM, signal.SIGKILL)
    times = {rank: _detected(job, rank, killed, VICTIM) for rank in (0, 1)}
    # A rank that enters the call after the death fails at once too.
    job.set("go")
    entered = job.next_event(LATE, ["entered"])["t"]
    times[LATE] = _detected(job, LATE, entered, VICTIM)
    print(f"\n[detect] SIGKILL mid-all_reduce ({api}, {count} float64): "
          + ", ".join(f"rank {r} {t * 1000:.0f} ms" for r, t in sorted(times.items())))


@pytest.mark.parametrize("api", ["facade", "await"])
def test_sigkill_mid_all_reduce_through_shared_memory_rings(rank_job, api: str) -> None:
    # Ranks that poll offer each other rings; with small rings the 160 KB
    # messages go on the sockets between the rings' frames (switching back and forth).
    env = {"ASYNCDIST_SPIN_US": "20", "ASYNCDIST_SHM_RING_BYTES": "16384"}
    job = rank_job(4, ["all_reduce", api, str(VICTIM), str(LATE), str(20_000)], env=env)
    for rank in (0, 1, VICTIM):
        job.next_event(rank, ["entered"])
    job.next_event(VICTIM, ["stalled"])
    killed = job.signal(VICTIM, signal.SIGKILL)
    for rank in (0, 1):
        _detected(job, rank, killed, VICTIM)
    job.set("go")
    entered = job.next_event(LATE, ["entered"])["t"]
    _detected(job, LATE, entered, VICTIM)


@pytest.mark.parametrize("api", ["facade", "await"])
def test_sigkill_mid_recv_fails_the_receivers_and_the_others_carry_on(rank_job, api: str) -> None:
    victim = 1
    job = rank_job(3, ["recv", api, str(victim)])
    job.next_event(victim, ["stalled"])
    for rank in (0, 2):
        job.next_event(rank, ["ready"])
    time.sleep(0.3)
    killed = job.signal(victim, signal.SIGKILL)
    # Rank 0 receives from the victim; rank 2 from any rank (the victim included).
    times = {rank: _detected(job, rank, killed, victim) for rank in (0, 2)}
    print(f"\n[detect] SIGKILL mid-recv ({api}): "
          + ", ".join(f"rank {r} {t * 1000:.0f} ms" for r, t in sorted(times.items())))
    # Subgroups without the victim (made before and after the death) and
    # point-to-point between the survivors still work.
    assert job.next_event(0, ["carried_on"])["values"] == [2.0, 2.0]
    assert job.next_event(2, ["carried_on"])["values"] == [2.0, 2.0, 7.0]


def test_sigkill_mid_large_send_fails_the_sender(rank_job) -> None:
    victim = 1
    job = rank_job(2, ["send", "facade", str(victim), str(8 << 20)])  # 64 MiB
    job.next_event(victim, ["stalled"])
    job.signal(victim, signal.SIGSTOP)  # it reads no more: the send stalls once the kernel's buffers are full
    job.set("go")
    job.next_event(0, ["entered"])
    time.sleep(0.5)
    assert job.events[0].empty(), "the send finished although the receiver was stopped"
    killed = job.signal(victim, signal.SIGKILL)
    took = _detected(job, 0, killed, victim)
    print(f"\n[detect] SIGKILL mid-64MiB-send (facade): rank 0 {took * 1000:.0f} ms")


def test_a_stopped_rank_is_found_by_the_heartbeat(rank_job) -> None:
    """SIGSTOP leaves the victim's sockets open, like a hung host or a cut
    cable: only the heartbeat can tell."""
    interval, timeout = 0.25, 1.5
    env = {"ASYNCDIST_HEARTBEAT_INTERVAL": str(interval), "ASYNCDIST_HEARTBEAT_TIMEOUT": str(timeout)}
    job = rank_job(4, ["all_reduce", "facade", str(VICTIM), str(LATE), "16"], env=env)
    for rank in (0, 1, VICTIM):
        job.next_event(rank, ["entered"])
    job.next_event(VICTIM, ["stalled"])
    stopped = job.signal(VICTIM, signal.SIGSTOP)
    event = job.next_event(1, ["error", "done"], timeout=30)  # rank 1 waits on the victim
    assert event["type"] == "PeerLostError" and event["lost"] == VICTIM, event
    assert f"rank {VICTIM} sent nothing for" in event["message"] and "heartbeat timeout 1.5 s" in event["message"]
    took = event["t"] - stopped
    # Silent since its last ping (at most 1.5 intervals before the stop), found
    # at most one check (interval / 2) after the timeout.
    assert timeout - 1.5 * interval - 0.1 <= took <= timeout + interval + 1.0, took
    relayed = _detected(job, 0, stopped, VICTIM)
    print(f"\n[detect] SIGSTOP mid-all_reduce, heartbeat {interval:g} s / {timeout:g} s: "
          f"rank 1 {took * 1000:.0f} ms, rank 0 (relayed) {relayed * 1000:.0f} ms")


async def test_a_stream_cut_mid_payload_fails_the_receive_reading_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # The payload must travel on the stream (by memory it is read at once;
    # tests/transport/test_cma.py covers that path's failures).
    monkeypatch.setenv("ASYNCDIST_CMA", "0")
    data = np.ones(4 << 20)  # 32 MiB: more than the kernel buffers
    async with local_world(2) as (a, b):
        receiving = b.irecv(np.empty_like(data), 0)
        sending = a.isend(data, 1)
        inbox = b.engine._inboxes[0]
        deadline = asyncio.get_running_loop().time() + 10
        while inbox.current is None:  # until b reads the payload into the receive
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.001)
        a.engine._connections[1]._lose("cut by the test", None)
        with pytest.raises(PeerLostError, match="rank 0") as info:
            await receiving
        assert info.value.rank == 0
        with pytest.raises(PeerLostError):
            await sending
        # The receive posted later, from the lost rank, fails at once.
        with pytest.raises(PeerLostError, match="rank 0"):
            await b.recv(np.empty(1), 0)

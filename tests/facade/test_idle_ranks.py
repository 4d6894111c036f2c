"""Idle ranks take no CPU: while ranks 0 and 1 ping-pong, ranks 2 and 3 wait
in a barrier, and the CPU time they use meanwhile is next to nothing.

CPU time (``resource.getrusage``: user + system, every thread of the
process) counts what a rank did, not how long it waited, so this holds on a
loaded machine too: a rank that polled, spun, or ran timers per operation
would show it whatever the load.
"""

from __future__ import annotations

import resource
import time

import numpy as np

from asyncdist.testing import spawn

ROUND_TRIPS = 300


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _ping_pong_beside_idle_ranks() -> tuple[float, float, list[float]]:
    import asyncdist as dist

    dist.init_process_group()
    try:
        rank = dist.get_rank()
        buf = np.full(2, rank, np.float32)
        dist.barrier()
        start, wall = _cpu(), time.monotonic()
        for i in range(ROUND_TRIPS if rank < 2 else 0):
            if rank == 0:
                buf[:] = i
                dist.send(buf, 1)
                dist.recv(buf, 1)
            else:
                dist.recv(buf, 0)
                dist.send(buf + 1, 0)
        dist.barrier()  # ranks 2 and 3 wait here all along
        return _cpu() - start, time.monotonic() - wall, buf.tolist()
    finally:
        dist.destroy_process_group()


def test_ranks_waiting_in_a_barrier_use_no_cpu_while_two_others_ping_pong() -> None:
    results = spawn(4, _ping_pong_beside_idle_ranks, timeout=120)
    (busy_cpu, wall, last), (other_cpu, _, _) = results[0], results[1]
    assert last == [ROUND_TRIPS] * 2  # rank 1's reply to the last round trip
    for idle_cpu, idle_wall, _ in results[2:]:
        # A rank that woke for every message, or polled, would use a good part of
        # a busy rank's CPU; waiting costs a few ms over the whole ping-pong.
        assert idle_cpu < 0.1 * min(busy_cpu, other_cpu) + 0.005, (idle_cpu, busy_cpu, wall)

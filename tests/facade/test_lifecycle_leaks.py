"""``destroy_process_group`` undoes ``init_process_group``: no thread, socket or
memory is left behind, however many times a process cycles through them."""

from __future__ import annotations

import os
import threading

import asyncdist as dist
from asyncdist.testing import spawn

CYCLES = 200
WARM_UP = 20
RSS_GROWTH_LIMIT = 20 * 2**20  # bytes, over CYCLES cycles after the warm-up


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _rss() -> int:
    """This process's resident set size, in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def _asyncdist_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("asyncdist"))


def _cycle(init_method: str | None = None, world_size: int = -1, rank: int = -1) -> None:
    # Threads of asyncdist's that other tests of this process left (a reader
    # of peers' memory, say) are not this init's to stop.
    before = set(threading.enumerate())
    dist.init_process_group(init_method=init_method, world_size=world_size, rank=rank)
    assert dist.is_initialized()
    dist.destroy_process_group()
    left = sorted(t.name for t in threading.enumerate() if t not in before and t.name.startswith("asyncdist"))
    assert not left, f"threads still running after destroy_process_group: {left}"


def test_init_destroy_cycles_leave_no_thread_fd_or_memory_behind() -> None:
    for _ in range(WARM_UP):
        _cycle("tcp://127.0.0.1:0", world_size=1, rank=0)
    threads, fds, rss = set(threading.enumerate()), _open_fds(), _rss()
    for _ in range(CYCLES):
        _cycle("tcp://127.0.0.1:0", world_size=1, rank=0)
    assert set(threading.enumerate()) == threads
    assert _open_fds() == fds
    growth = _rss() - rss
    assert growth < RSS_GROWTH_LIMIT, f"RSS grew {growth / 2**20:.1f} MiB over {CYCLES} init/destroy cycles"


def two_ranks_cycle(cycles: int) -> tuple[int, int, list[str]]:
    """A rank: init and destroy ``cycles`` times (env://, from spawn); the fd
    count after the first cycle and after the last, and the threads left."""
    _cycle()
    fds = _open_fds()
    for _ in range(cycles - 1):
        _cycle()
    return fds, _open_fds(), _asyncdist_threads()


def test_two_ranks_init_destroy_cycles_leave_nothing_behind() -> None:
    for rank, (first, last, threads) in enumerate(spawn(2, two_ranks_cycle, 20, timeout=60)):
        assert (last, threads) == (first, []), f"rank {rank}"

"""Several hosts: ranks in separate network namespaces, each with its own address.

Three namespaces, one per rank, hang off a bridge in a fourth, each through
a veth pair, on 10.231.0.0/24. All of it exists only inside namespaces this
test creates (nothing is added to the host's own), and is deleted at the end.
Rank 0 serves the job's store as under ``env://``, on its own address, and
every rank finds its address by the route to it (no ASYNCDIST_HOST).

Checked: results across the namespaces; results with added delay and loss
(``tc netem``, where the kernel has it); and a link taken down mid-run, which
leaves every TCP stream half-open, so only the heartbeat can tell: every rank
gets a clear PeerLostError within the heartbeat timeout.

Skipped unless running as root where ``ip netns add`` works.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from typing import Iterator

import pytest

N = 3
SUBNET = "10.231.0"
# Namespaces share this machine's memory and /proc, so their ranks would link
# by shared-memory rings, and a cut cable would not cut them; hosts apart
# cannot. So the rings are off, as between hosts, with the heartbeat settings.
HEARTBEAT = {"ASYNCDIST_HEARTBEAT_INTERVAL": "0.5", "ASYNCDIST_HEARTBEAT_TIMEOUT": "3", "ASYNCDIST_SHM": "0"}


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def _can_make_namespaces() -> str | None:
    """None if namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "needs root"
    if shutil.which("ip") is None:
        return "needs iproute2 (ip)"
    probe = f"adprobe{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot create network namespaces: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


_WHY_NOT = _can_make_namespaces()
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=f"network namespaces: {_WHY_NOT}")


class Hosts:
    """The namespaces, their veths and the bridge; ``down(i)`` unplugs rank i."""

    def __init__(self) -> None:
        tag = f"ad{os.getpid() % 100000}"
        self.bridge = f"{tag}br"
        self.ranks = [f"{tag}r{i}" for i in range(N)]
        self.addresses = [f"{SUBNET}.{i + 1}" for i in range(N)]
        self.made: list[str] = []
        try:
            for ns in (self.bridge, *self.ranks):
                _ip("netns", "add", ns)
                self.made.append(ns)
                _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.bridge, "link", "set", "br0", "up")
            for i, ns in enumerate(self.ranks):
                # Both ends are made inside their namespaces: the host's stays untouched.
                _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"port{i}", "netns", self.bridge)
                _ip("-n", self.bridge, "link", "set", f"port{i}", "master", "br0")
                _ip("-n", self.bridge, "link", "set", f"port{i}", "up")
                _ip("-n", ns, "addr", "add", f"{self.addresses[i]}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
        except BaseException:
            self.remove()
            raise

    def wrap(self) -> list[list[str]]:
        return [["ip", "netns", "exec", ns] for ns in self.ranks]

    def netem(self, spec: list[str]) -> str | None:
        """Add ``tc qdisc ... netem SPEC`` on every rank's link; None, or why it is unavailable."""
        for ns in self.ranks:
            done = subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", "netem",
                                   *spec], capture_output=True, text=True, timeout=30)
            if done.returncode != 0:
                return done.stderr.strip() or "tc failed"
        return None

    def down(self, rank: int) -> float:
        _ip("-n", self.bridge, "link", "set", f"port{rank}", "down")
        return time.monotonic()

    def remove(self) -> None:
        for ns in reversed(self.made):
            _ip("netns", "del", ns, check=False)
        self.made.clear()


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    made = Hosts()
    try:
        yield made
    finally:
        made.remove()
        left = _ip("netns", "list").stdout
        assert not any(ns in left for ns in (made.bridge, *made.ranks)), left


def _start(rank_job, hosts: Hosts, rounds: int, count: int, env: dict[str, str] | None = None):
    return rank_job(N, ["rounds", "facade", str(rounds), str(count)], wrap=hosts.wrap(), master=hosts.addresses[0],
                    serve_store=False, env={"MASTER_PORT": "29500", **HEARTBEAT, **(env or {})})


def _checked(job, count: int) -> None:
    for rank in range(N):
        for c in (16, count):
            event = job.next_event(rank, ["checked"], timeout=120)
            assert event["count"] == c and event["ok"], event


def test_all_reduce_across_namespaces(rank_job, hosts: Hosts) -> None:
    job = _start(rank_job, hosts, rounds=3, count=1 << 20)  # 8 MiB: the ring, in chunks
    _checked(job, 1 << 20)
    for rank in range(N):
        assert job.next_event(rank, ["done", "error"], timeout=60)["event"] == "done"
        assert all(e["ok"] for e in job.seen[rank] if e["event"] == "round")


def test_all_reduce_with_delay_and_loss(rank_job, hosts: Hosts) -> None:
    if shutil.which("tc") is None:
        pytest.skip("needs tc (iproute2)")
    why = hosts.netem(["delay", "20ms", "loss", "1%"])
    if why is not None:
        pytest.skip(f"tc netem is not available here: {why}")
    job = _start(rank_job, hosts, rounds=3, count=1 << 16)  # 512 KiB: the ring, through the loss
    _checked(job, 1 << 16)
    for rank in range(N):
        assert job.next_event(rank, ["done", "error"], timeout=120)["event"] == "done"


def test_a_link_taken_down_mid_run_is_a_clear_error_on_every_rank(rank_job, hosts: Hosts) -> None:
    job = _start(rank_job, hosts, rounds=10_000, count=16)
    _checked(job, 16)
    for rank in range(N):
        job.next_event(rank, ["round"], timeout=60)
    cut = hosts.down(2)  # rank 2's cable: no FIN, no RST, just silence
    timeout = float(HEARTBEAT["ASYNCDIST_HEARTBEAT_TIMEOUT"])
    took = {}
    for rank in range(N):
        event = job.next_event(rank, ["error", "done"], timeout=60)
        assert event["event"] == "error", event
        assert event["type"] == "PeerLostError", event
        # Ranks 0 and 1 lose rank 2; rank 2, cut off, loses whom it was waiting for.
        if rank != 2:
            assert event["lost"] == 2 and "rank 2" in event["message"], event
        assert "sent nothing for" in event["message"] or "relayed by rank" in event["message"], event
        took[rank] = event["t"] - cut
        assert took[rank] < timeout + 3, (rank, took[rank], event)
    print("\n[detect] link down mid-run (heartbeat 0.5 s / 3 s): "
          + ", ".join(f"rank {r} {t * 1000:.0f} ms" for r, t in sorted(took.items())))

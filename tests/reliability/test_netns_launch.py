"""Several hosts by hand: ``asyncdist-run --nnodes 3`` on three network namespaces.

Each namespace is a "host" with its own address (built by
:class:`test_netns.Hosts`: veth pairs on a bridge, nothing added to the
host's own network), and runs one launcher with two workers of
``netns_train.py``, a data-parallel least-squares training with the facade.
This is the worked example of docs/launcher.md's "Several nodes".

Checked, in one launch (each launch of three nodes costs ~10 s of CI): the
nodes start one by one, and each late one is waited for with a progress
message (node 1's launcher waits for node 0's store; node 0's ranks wait for
node 2's); every rank has the weights of a sequential NumPy run after 300
steps; then node 2's link goes down (no FIN, no RST) and that is reported as a
PeerLostError on every other node within the heartbeat timeout. (A clean exit
of a multi-node job is tested on loopback, in tests/launcher/test_run.py.)

Skipped unless running as root where ``ip netns add`` works.
"""

from __future__ import annotations

import json
import os
import queue
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from test_netns import HEARTBEAT, N, Hosts, _WHY_NOT
from netns_train import EVERY, LR, data

pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=f"network namespaces: {_WHY_NOT}")

SCRIPT = Path(__file__).with_name("netns_train.py")
PROCS = 2  # workers per node
PORT = "29500"  # node 0's store: a fixed port is safe in a namespace of this test's own


class Node:
    """One ``asyncdist-run`` in namespace ``hosts.ranks[index]``; its output lines, timed, in a queue."""

    def __init__(self, hosts: Hosts, index: int, args: list[str], env: dict[str, str]) -> None:
        self.index = index
        self.lines: queue.Queue[tuple[float, str]] = queue.Queue()
        self.seen: list[str] = []
        command = ["ip", "netns", "exec", hosts.ranks[index], sys.executable, "-m", "asyncdist.run",
                   "--nnodes", str(N), "--node-rank", str(index), "--nproc-per-node", str(PROCS),
                   "--master-addr", hosts.addresses[0], "--master-port", PORT, str(SCRIPT), *args]
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put((time.monotonic(), line.rstrip("\n")))

    def expect(self, pattern: str, timeout: float = 90) -> tuple[float, re.Match]:
        """The first line from now on that matches ``pattern``, and when it came."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                when, line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError(f"node {self.index}: no line matching {pattern!r} within {timeout} s; "
                                     "saw:\n" + "\n".join(self.seen)) from None
            self.seen.append(line)
            found = re.search(pattern, line)
            if found:
                return when, found

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self._reader.join(timeout=15)  # EOF once every process holding the pipe is gone
        assert self.process.stdout is not None
        self.process.stdout.close()


@pytest.fixture
def launch() -> Iterator:
    """``launch(*script_args)`` -> ``(start, hosts)``: ``start(i)`` starts node i's launcher.
    Every node is stopped, and every namespace removed, after the test."""
    hosts = Hosts()
    nodes: list[Node] = []
    env = {**os.environ, **HEARTBEAT, "ASYNCDIST_SECRET": secrets.token_hex(16), "ASYNCDIST_INIT_REPORT_EVERY": "1"}

    def launch_with(*args: str):
        def start(index: int) -> Node:
            nodes.append(Node(hosts, index, list(args), env))
            return nodes[-1]
        return start, hosts

    try:
        yield launch_with
    finally:
        for node in nodes:
            node.stop()
        hosts.remove()


def _reference(steps: int) -> np.ndarray:
    x, y = data()
    w = np.zeros(x.shape[1])
    for _ in range(steps):
        w -= LR * (x.T @ (x @ w - y) / len(y))
    return w


def test_late_nodes_are_waited_for_ranks_train_the_reference_and_a_lost_link_is_reported(launch) -> None:
    start, hosts = launch(str(10**9), "hold")  # trains until the failure, then waits to be stopped
    node1 = start(1)  # before node 0: its launcher waits for node 0's store
    node1.expect(rf"asyncdist-run: waiting for node 0's store at {re.escape(hosts.addresses[0])}:{PORT}: .*; retrying")
    node0 = start(0)  # node 2 is late: node 0's ranks say whom they wait for
    node0.expect(rf"\[rank 0\]: rank 0: waiting at tcp://.* for ranks \[4, 5\] of {N * PROCS}")
    nodes = [node0, node1, start(2)]
    expected = _reference(EVERY)
    for index, node in enumerate(nodes):
        for _ in range(PROCS):
            _, found = node.expect(rf"weights (\d+) {EVERY} (\[.*\])")
            assert int(found[1]) // PROCS == index
            np.testing.assert_allclose(json.loads(found[2]), expected, rtol=1e-10, atol=1e-12)

    cut = hosts.down(2)  # node 2's cable: its streams go silent, only the heartbeat can tell
    timeout = float(HEARTBEAT["ASYNCDIST_HEARTBEAT_TIMEOUT"])
    took = []
    for node in nodes[:2]:
        for _ in range(PROCS):  # each rank: by its own heartbeat, or another rank's relayed abort
            when, found = node.expect(r"error PeerLostError lost=(\d+) (.*)")
            assert int(found[1]) in (4, 5) and f"rank {found[1]}" in found[2], found[0]
            took.append(when - cut)
            assert took[-1] < timeout + 3, (node.index, took[-1])
    print("\n[detect] node 2's link down (heartbeat 0.5 s / 3 s): nodes 0-1 reported it after "
          + ", ".join(f"{t * 1000:.0f}" for t in took) + " ms")

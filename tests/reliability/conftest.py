"""A harness for the reliability tests that need real rank processes.

``RankJob`` serves the job's store (authenticated with the job's secret),
starts one process per rank running ``rank_main.py`` with a launcher's
environment, reads the JSON events they print, and can stop, kill and
signal them through the store. Every process is killed when the test ends.
"""

from __future__ import annotations

import json
import os
import queue
import secrets
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Iterator, Sequence

import pytest

from asyncdist.rendezvous.tcp_store import TCPStore

RANK_MAIN = Path(__file__).with_name("rank_main.py")


class RankJob:
    """``n`` rank processes running one scenario of ``rank_main.py``.

    Args:
        n: the number of ranks.
        argv: the scenario and its arguments.
        env: extra environment for every rank; ``rank_env`` by rank.
        wrap: a command to run each rank under (``ip netns exec NS``), by rank.
        master: the address the ranks find the store at.
        serve_store: serve the store here (else rank 0 serves it, as under env://).
        script: the rank program (default ``rank_main.py``).
    """

    def __init__(self, n: int, argv: Sequence[str], *, env: dict[str, str] | None = None,
                 wrap: Sequence[Sequence[str]] | None = None, master: str = "127.0.0.1",
                 serve_store: bool = True, rank_env: Sequence[dict[str, str]] | None = None,
                 script: Path = RANK_MAIN) -> None:
        self.n = n
        self.secret = secrets.token_hex(16)
        self.store = None
        port = "0"
        if serve_store:
            self.store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                  timeout=timedelta(seconds=30), secret=self.secret)
            port = str(self.store.port)
        base = {
            **os.environ,
            "WORLD_SIZE": str(n),
            "MASTER_ADDR": master,
            "MASTER_PORT": port,
            "ASYNCDIST_SECRET": self.secret,
            "ASYNCDIST_JOB_ID": uuid.uuid4().hex,
            **({"TORCHELASTIC_USE_AGENT_STORE": "True"} if serve_store else {}),
            **(env or {}),
        }
        self.events: list[queue.Queue] = [queue.Queue() for _ in range(n)]
        self.seen: list[list[dict]] = [[] for _ in range(n)]
        self.stderr: list[list[str]] = [[] for _ in range(n)]
        self.procs: list[subprocess.Popen] = []
        self._readers: list[threading.Thread] = []
        for rank in range(n):
            cmd = [*(wrap[rank] if wrap else ()), sys.executable, str(script), *argv]
            env_r = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank), **(rank_env[rank] if rank_env else {})}
            proc = subprocess.Popen(cmd, env=env_r, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            self.procs.append(proc)
            for target in (self._read, self._drain_stderr):
                thread = threading.Thread(target=target, args=(rank, proc), daemon=True)
                thread.start()
                self._readers.append(thread)

    def _read(self, rank: int, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            try:
                self.events[rank].put(json.loads(line))
            except ValueError:
                self.stderr[rank].append(f"stdout: {line}")

    def _drain_stderr(self, rank: int, proc: subprocess.Popen) -> None:
        for line in proc.stderr:
            self.stderr[rank].append(line)

    def next_event(self, rank: int, names: Sequence[str], timeout: float = 60.0) -> dict:
        """The next event of ``rank`` among ``names`` (others are kept in ``seen``)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"rank {rank} did not report {list(names)} within {timeout} s; "
                                     f"saw {self.seen[rank]}; stderr:\n{''.join(self.stderr[rank])[-3000:]}")
            try:
                event = self.events[rank].get(timeout=min(remaining, 0.5))
            except queue.Empty:
                if self.procs[rank].poll() is not None and self.events[rank].empty():
                    time.sleep(0.2)  # let the reader thread deliver the last lines
                    if self.events[rank].empty():
                        raise AssertionError(f"rank {rank} exited ({self.procs[rank].returncode}) before "
                                             f"{list(names)}; saw {self.seen[rank]}; stderr:\n"
                                             f"{''.join(self.stderr[rank])[-3000:]}") from None
                continue
            self.seen[rank].append(event)
            if event["event"] in names:
                return event

    def signal(self, rank: int, sig: int) -> float:
        """Send ``sig`` to ``rank``'s process; return the monotonic time right before.

        Before, not after: a peer can see the death before this process is
        scheduled again, so a time taken after the signal can be later than
        the peer's detection (seen in CI: -0.17 ms).
        """
        sent = time.monotonic()
        self.procs[rank].send_signal(sig)
        return sent

    def set(self, key: str) -> None:
        """Release the ranks waiting for ``key``."""
        assert self.store is not None
        self.store.set(f"test/{key}", "1")

    def close(self) -> None:
        """Kill every rank (a stopped one too: SIGKILL ends it), and release the store."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            proc.wait(timeout=30)
        for thread in self._readers:
            thread.join(timeout=10)  # they end at EOF
        for proc in self.procs:
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        if self.store is not None:
            self.store.close()


@pytest.fixture
def rank_job() -> Iterator:
    """``rank_job(n, argv, **kw)`` starts a :class:`RankJob`; all are closed after the test."""
    jobs: list[RankJob] = []

    def start(n: int, argv: Sequence[str], **kw) -> RankJob:
        job = RankJob(n, argv, **kw)
        jobs.append(job)
        return job

    yield start
    for job in jobs:
        job.close()

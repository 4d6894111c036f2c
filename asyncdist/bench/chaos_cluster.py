"""The chaos benchmark's processes: start, order, kill and reap the workers of one path.

A :class:`Cluster` starts :mod:`~asyncdist.bench.chaos_worker` processes with
what their path needs, and gathers the json events they print into one
queue (a reader thread per process). The driver (:mod:`asyncdist.bench.chaos`)
decides when to kill; this module only does it, and on :meth:`Cluster.close`
kills and reaps every process it started, whatever state they are in.

* ``asyncdist``: a store served here (asyncdist's ``TCPStore``, bound to port
  0) and a launcher's environment, as ``asyncdist-run`` gives its workers; a
  replacement gets ``ASYNCDIST_JOIN=1`` and no rank, as under ``--replace``.
* ``torchft-*``: a ``LighthouseServer`` here (from the torchft wheel); each
  worker is a replica group of one process, and a replacement takes the
  replica id of the process it replaces.
"""

from __future__ import annotations

import json
import os
import queue
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from typing import IO, Any

from ..settings import JOIN_ENV

__all__ = ["Cluster", "Event", "Worker"]

#: The lighthouse process: prints its address, serves until its stdin closes (or it is killed).
_LIGHTHOUSE = """
import sys
from torchft.coordination import LighthouseServer
ms = int(sys.argv[1])
server = LighthouseServer(bind="[::]:0", min_replicas=1, **({"heartbeat_timeout_ms": ms} if ms else {}))
print(server.address(), flush=True)
sys.stdin.read()
server.shutdown()
"""


@dataclass(eq=False)  # identity: a worker is a process
class Worker:
    """One worker process: its slot (the replica it stands for), and when it was started."""

    slot: int
    proc: subprocess.Popen
    started: float
    replacement: bool
    log: str
    reader: threading.Thread | None = None

    def tell(self, line: str) -> None:
        """Send an order on the worker's stdin (ignored once it has exited)."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass


@dataclass(frozen=True)
class Event:
    """An event a worker printed, or its exit (``event == "exit"``, ``code`` set)."""

    worker: Worker
    fields: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.fields["event"])

    @property
    def t(self) -> float:
        return float(self.fields["t"])


class Cluster:
    """The workers of one path, their events, and what they need (store or lighthouse)."""

    def __init__(self, path: str, model_json: str, timeout: float, heartbeat_ms: int | None) -> None:
        self.path, self.model_json, self.timeout = path, model_json, timeout
        self.events: queue.Queue[Event] = queue.Queue()
        self.workers: list[Worker] = []
        self.folder = tempfile.mkdtemp(prefix="asyncdist-chaos-")
        self._env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        self._store: Any = None
        self._lighthouse: subprocess.Popen | None = None
        self._lighthouse_addr = ""
        self._replaced = 0
        if path == "asyncdist":
            from ..rendezvous.tcp_store import TCPStore

            secret = secrets.token_hex(16)
            self._store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, secret=secret)
            self._env.update({
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(self._store.port),
                "TORCHELASTIC_USE_AGENT_STORE": "True", "ASYNCDIST_AGENT_STORE": "asyncdist",
                "ASYNCDIST_SECRET": secret, "ASYNCDIST_JOB_ID": uuid.uuid4().hex,
            })
        else:  # in a process of its own: its import of torch, and its log, stay out of the driver
            self._lighthouse = subprocess.Popen(
                [sys.executable, "-c", _LIGHTHOUSE, str(heartbeat_ms or 0)], env=self._env, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            assert self._lighthouse.stdout is not None
            self._lighthouse_addr = self._lighthouse.stdout.readline().strip()
            if not self._lighthouse_addr:
                raise RuntimeError(f"the torchft lighthouse did not start (exit code {self._lighthouse.wait()})")

    def start(self, n: int) -> None:
        """Start the ``n`` workers of the job."""
        if self.path == "asyncdist":
            self._env.update({"WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n)})
        for slot in range(n):
            self._spawn(slot, replacement=False)

    def replace(self, dead: Worker) -> Worker:
        """Start a replacement for ``dead`` (killed before), and tell every live worker how many there were."""
        self._replaced += 1
        return self._spawn(dead.slot, replacement=True)

    def announce(self) -> None:
        """Tell every live worker how many replacements were started (they grow when all have heard)."""
        self.tell_all(f"grow {self._replaced}")

    def tell_all(self, line: str) -> None:
        for worker in self.live():
            worker.tell(line)

    def live(self) -> list[Worker]:
        return [w for w in self.workers if w.proc.poll() is None]

    def kill(self, worker: Worker) -> float:
        """SIGKILL ``worker``; returns when the signal was sent (``time.monotonic()``)."""
        sent = time.monotonic()
        worker.proc.send_signal(signal.SIGKILL)
        return sent

    def close(self) -> None:
        """Kill and reap every worker, and stop the store or lighthouse."""
        for worker in self.workers:
            if worker.proc.poll() is None:
                worker.proc.kill()
        for worker in self.workers:
            worker.proc.wait()
            if worker.reader is not None:
                worker.reader.join(timeout=10)
            for stream in (worker.proc.stdin, worker.proc.stdout):
                if stream is not None:
                    stream.close()
        if self._store is not None:
            self._store.close()
        if self._lighthouse is not None:
            self._lighthouse.kill()
            self._lighthouse.wait()
            for stream in (self._lighthouse.stdin, self._lighthouse.stdout):
                if stream is not None:
                    stream.close()

    def log_tail(self, worker: Worker, chars: int = 2000) -> str:
        """The end of a worker's stderr (for a failed run's message)."""
        try:
            with open(worker.log) as f:
                return f.read()[-chars:]
        except OSError:
            return ""

    def _spawn(self, slot: int, replacement: bool) -> Worker:
        n = len(self.workers)
        out = os.path.join(self.folder, f"weights{n}.npy")
        argv = [sys.executable, "-m", "asyncdist.bench.chaos_worker", self.path, out, "--model", self.model_json,
                "--timeout", str(self.timeout)]
        env = dict(self._env)
        if replacement:
            argv.append("--replacement")
        if self.path == "asyncdist":
            if replacement:
                env[JOIN_ENV] = "1"
            else:
                env.update({"RANK": str(slot), "LOCAL_RANK": str(slot)})
        else:
            argv += ["--lighthouse", self._lighthouse_addr, "--replica-id", f"replica{slot}"]
        log = os.path.join(self.folder, f"stderr{n}.log")
        with open(log, "w") as err:
            proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                    text=True)
        worker = Worker(slot, proc, time.monotonic(), replacement, log)
        self.workers.append(worker)
        assert proc.stdout is not None
        worker.reader = threading.Thread(target=self._read, args=(worker, proc.stdout), daemon=True)
        worker.reader.start()
        return worker

    def _read(self, worker: Worker, stdout: IO[str]) -> None:
        for line in stdout:
            try:
                fields = json.loads(line)
            except ValueError:
                continue  # a stray print
            self.events.put(Event(worker, fields))
        self.events.put(Event(worker, {"event": "exit", "t": time.monotonic(), "code": worker.proc.wait()}))

"""``python -m asyncdist.bench.faults``: what fault tolerance costs, and how fast a job recovers.

Two measurements, on rank processes of this host, started here with a
launcher's environment and a store served by this process (the ranks run
the await API; see ``docs/fault-tolerance.md``):

* **cost**: the time of one ``agree(1)`` and of one ``shrink()`` when
  nobody failed (median over the calls of rank 0; the calls of a group are
  in step, so every rank sees about the same);
* **recovery**: the ranks run small all_reduces in a loop; one is killed
  (SIGKILL: its sockets reset) or hung (SIGSTOP: only the heartbeat finds it).
  Each survivor revokes, agrees, shrinks and runs an all_reduce in the new
  group; the figure is the time from the signal to the last survivor's
  first right all_reduce there (``time.monotonic()``, one clock for every
  process of a host). Median over ``--repeat`` jobs.

docs/benchmarks.md ("Fault tolerance") says how to run it. It is apart from
``asyncdist-bench`` because it kills its own ranks, which that runner treats
as a failed run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import time
import uuid

import numpy as np

__all__ = ["main"]

_SHORT = {"ASYNCDIST_HEARTBEAT_INTERVAL": "0.25", "ASYNCDIST_HEARTBEAT_TIMEOUT": "1"}


def _emit(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, "t": time.monotonic(), **fields}), flush=True)


# -- the rank side ------------------------------------------------------------------


async def _cost(calls: int) -> None:
    import asyncdist

    g = await asyncdist.init_world(timeout=120)
    for _ in range(10):  # warm up: connections, code paths
        await g.agree(1)
    agree = []
    for _ in range(calls):
        start = time.perf_counter()
        await g.agree(1)
        agree.append(time.perf_counter() - start)
    shrink = []
    for _ in range(calls):
        start = time.perf_counter()
        g = await g.shrink()
        shrink.append(time.perf_counter() - start)
    await g.barrier()
    _emit("cost", agree_us=statistics.median(agree) * 1e6, shrink_us=statistics.median(shrink) * 1e6)
    await g.close()


async def _recover() -> None:
    import asyncdist
    from asyncdist.errors import AsyncDistError

    g = await asyncdist.init_world(timeout=120)
    _emit("ready", pid=os.getpid())
    while True:
        try:
            x = np.ones(8)
            await g.all_reduce(x)
            continue
        except AsyncDistError as exc:
            error = str(exc)
            await g.revoke()
        await g.agree(0)
        g = await g.shrink()
        x = np.ones(8)
        await g.all_reduce(x)
        assert x[0] == g.size, x
        _emit("working", size=g.size, error=error)
        await g.close()
        return


# -- the launcher side --------------------------------------------------------------


class _Job:
    """``n`` rank processes of this module, with their store; events read from stdout."""

    def __init__(self, n: int, argv: list[str], env: dict[str, str]) -> None:
        from ..rendezvous.tcp_store import TCPStore

        secret = secrets.token_hex(16)
        self.store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, secret=secret)
        base = {
            **os.environ, **env, "WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(self.store.port), "TORCHELASTIC_USE_AGENT_STORE": "True",
            "ASYNCDIST_AGENT_STORE": "asyncdist", "ASYNCDIST_SECRET": secret, "ASYNCDIST_JOB_ID": uuid.uuid4().hex,
        }
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-m", "asyncdist.bench.faults", "--rank", *argv],
                env={**base, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                text=True,
            )
            for r in range(n)
        ]

    def event(self, rank: int, name: str) -> dict:
        stdout = self.procs[rank].stdout
        assert stdout is not None
        for line in stdout:
            event = json.loads(line)
            if event["event"] == name:
                return event
        raise RuntimeError(f"rank {rank} exited (code {self.procs[rank].wait()}) before {name!r}")

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        self.store.close()


def measure_cost(n: int, calls: int) -> dict:
    """Median ``agree`` and ``shrink`` times (us) on ``n`` ranks when nobody failed."""
    job = _Job(n, ["cost", str(calls)], {})
    try:
        return job.event(0, "cost")
    finally:
        job.close()


def measure_recovery(n: int, sig: int, env: dict[str, str]) -> float:
    """Seconds from ``sig`` to the last survivor working in the shrunk group, on ``n`` ranks."""
    job = _Job(n, ["recover"], env)
    try:
        for rank in range(n):
            job.event(rank, "ready")
        time.sleep(0.3)  # the all_reduce loop runs
        victim = n - 1 if n == 2 else n // 2
        sent = time.monotonic()
        job.procs[victim].send_signal(sig)
        return max(job.event(r, "working")["t"] for r in range(n) if r != victim) - sent
    finally:
        job.close()


def main(argv: list[str] | None = None) -> None:
    """Print the cost and recovery tables (markdown)."""
    parser = argparse.ArgumentParser(prog="python -m asyncdist.bench.faults", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="jobs per recovery figure (median)")
    parser.add_argument("--calls", type=int, default=200, help="agree/shrink calls per cost figure")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8], help="world sizes for recovery")
    parser.add_argument("--rank", nargs="+", help=argparse.SUPPRESS)  # inside a rank process
    args = parser.parse_args(argv)
    if args.rank:
        asyncio.run(_cost(int(args.rank[1])) if args.rank[0] == "cost" else _recover())
        return
    print("| ranks | agree(1), median | shrink(), median |\n|---|---|---|")
    for n in (2, 4):
        cost = measure_cost(n, args.calls)
        print(f"| {n} | {cost['agree_us']:.0f} us | {cost['shrink_us']:.0f} us |")
    print("\n| ranks | SIGKILL, default heartbeat | SIGKILL, short heartbeat | SIGSTOP, short heartbeat |")
    print("|---|---|---|---|")
    for n in args.ranks:
        cells = []
        for sig, env in ((signal.SIGKILL, {}), (signal.SIGKILL, _SHORT), (signal.SIGSTOP, _SHORT)):
            times = [measure_recovery(n, sig, env) for _ in range(args.repeat)]
            cells.append(f"{statistics.median(times) * 1000:.0f} ms ({min(times) * 1000:.0f}-{max(times) * 1000:.0f})")
        print(f"| {n} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

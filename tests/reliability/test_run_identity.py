"""Run identity: a process from an earlier run never joins a new job, nor disturbs it.

A job of two ranks started by hand (``init_main.py``, env://) is running; a
stale process that believes it is rank 1 of a job at the same address
arrives. It must get a clear error at once, and the job's results must be
right. The same holds while the job's ranks are still gathering, for a
process whose run id (``ASYNCDIST_JOB_ID``, which ``asyncdist-run`` gives
every run) is not the job's.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

INIT_MAIN = Path(__file__).with_name("init_main.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(port: int, rank: int, **extra: str) -> dict[str, str]:
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank), "WORLD_SIZE": "2"}
    for name in ("ASYNCDIST_STORE_ADDR", "TORCHELASTIC_USE_AGENT_STORE", "ASYNCDIST_SECRET", "ASYNCDIST_JOB_ID"):
        env.pop(name, None)
    return {**env, **extra}


def test_a_stale_process_gets_an_error_and_the_job_is_not_disturbed(tmp_path: Path) -> None:
    port, hold = _free_port(), tmp_path / "hold"
    hold.touch()
    job = [subprocess.Popen([sys.executable, str(INIT_MAIN)], env=_env(port, r, HOLD_FILE=str(hold)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    try:
        for proc in job:  # both joined (a line each, within their own 20 s timeout)
            assert proc.stdout is not None and json.loads(proc.stdout.readline()) == {"joined": True}
        start = time.monotonic()
        stale = subprocess.run([sys.executable, str(INIT_MAIN)], env=_env(port, 1), capture_output=True, text=True,
                               timeout=60)
        took = time.monotonic() - start
        hold.unlink()  # the job may end now
        results = [json.loads(proc.communicate(timeout=60)[0].splitlines()[-1]) for proc in job]
    finally:
        for proc in job:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert [r.get("sum") for r in results] == [1.0, 1.0], results
    error = json.loads(stale.stdout.splitlines()[-1])
    assert error["error"] == "RendezvousError", error
    assert error["message"].startswith(f"rank 1: a job is already running at tcp://127.0.0.1:{port}; "
                                       "its ranks [0, 1] joined at "), error
    assert f"this process (pid {error['pid']} on {socket.gethostname()}) is not one of them" in error["message"]
    assert took < 8, took


def test_a_stale_process_of_another_run_arriving_while_the_ranks_gather_leaves_them_alone() -> None:
    port = _free_port()
    new = {"ASYNCDIST_JOB_ID": "run-2"}
    zero = subprocess.Popen([sys.executable, str(INIT_MAIN)], env=_env(port, 0, **new), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        # Rank 0 waits for its rank 1; a process of the earlier run comes first.
        start = time.monotonic()
        stale = subprocess.run([sys.executable, str(INIT_MAIN)], env=_env(port, 1, ASYNCDIST_JOB_ID="run-1"),
                               capture_output=True, text=True, timeout=60)
        took = time.monotonic() - start
        one = subprocess.run([sys.executable, str(INIT_MAIN)], env=_env(port, 1, **new), capture_output=True,
                             text=True, timeout=60)
        results = [json.loads(out.splitlines()[-1]) for out in (zero.communicate(timeout=60)[0], one.stdout)]
    finally:
        if zero.poll() is None:
            zero.kill()
            zero.wait()
    assert [r.get("sum") for r in results] == [1.0, 1.0], results  # the new job, undisturbed
    error = json.loads(stale.stdout.splitlines()[-1])
    assert error["error"] == "RendezvousError", error
    assert error["message"] == (
        f"rank 1: the rendezvous at tcp://127.0.0.1:{port} belongs to another run ('run-2'), and this process "
        f"(pid {error['pid']} on {socket.gethostname()}) is of run 'run-1': is it a stale process of an earlier "
        "run? It leaves that run alone (give every rank of one job the same ASYNCDIST_JOB_ID, and each job its own "
        "MASTER_PORT)"), error
    assert took < 8, took

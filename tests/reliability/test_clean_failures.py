"""Clean failures: a peer's Ctrl-C or SIGTERM is named as such, and no rank prints asyncio's noise.

Ranks started by hand (``interrupt_main.py``) wait on rank 1, in a receive
or in a collective; the test interrupts, terminates or kills rank 1 once
every rank printed ``ready``, and reads what the others say, on asyncio's
loop and on uvloop.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("interrupt_main.py")
# What asyncio prints when a failure escapes the code that should have handled it.
NOISE = ("never retrieved", "Exception in callback", "Task was destroyed but it is pending", "Unclosed",
         "unclosed transport", "cleanup at exit failed", "already running", "Exception ignored")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(world: int, wait_in: str, loop: str) -> list[subprocess.Popen]:
    port = str(_free_port())
    procs = []
    for rank in range(world):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "RANK": str(rank),
               "WORLD_SIZE": str(world), "ASYNCDIST_LOOP": loop}
        for name in ("ASYNCDIST_STORE_ADDR", "TORCHELASTIC_USE_AGENT_STORE", "ASYNCDIST_SECRET", "ASYNCDIST_JOB_ID"):
            env.pop(name, None)
        procs.append(subprocess.Popen([sys.executable, str(SCRIPT), wait_in], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    for proc in procs:  # a line each, within the ranks' own timeout
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return procs


WORDING = {signal.SIGINT: "rank 1 was interrupted (SIGINT)", signal.SIGTERM: "rank 1 was terminated (SIGTERM)",
           signal.SIGKILL: "rank 1"}
# What rank 1 itself ends with: each signal kills it, as Python does by default (after
# its KeyboardInterrupt traceback for SIGINT, its goodbye for SIGINT and SIGTERM).
EXIT = {signal.SIGINT: -signal.SIGINT, signal.SIGTERM: -signal.SIGTERM, signal.SIGKILL: -signal.SIGKILL}


@pytest.mark.parametrize("wait_in, world, signum, loop", [
    ("p2p", 2, signal.SIGINT, "asyncio"),
    ("p2p", 2, signal.SIGTERM, "asyncio"),
    ("p2p", 2, signal.SIGKILL, "uvloop"),
    ("collective", 3, signal.SIGKILL, "asyncio"),
    ("collective", 3, signal.SIGKILL, "uvloop"),
    ("collective", 3, signal.SIGTERM, "uvloop"),
])
def test_a_peer_that_is_stopped_is_named_and_nobody_prints_noise(wait_in: str, world: int, signum: int,
                                                                 loop: str) -> None:
    procs = _start(world, wait_in, loop)
    try:
        procs[1].send_signal(signum)
        ends = [proc.communicate(timeout=60) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert procs[1].returncode == EXIT[signum], ends[1][1]
    for rank in {0, world - 1} - {1}:
        result = json.loads(ends[rank][0].splitlines()[-1])
        assert result["error"] == "PeerLostError" and WORDING[signum] in result["message"], result
        if signum != signal.SIGKILL:  # the goodbye names the cause, and comes first
            assert result["message"].startswith(WORDING[signum]), result
            assert "closed its process group" not in result["message"]
        assert procs[rank].returncode == 0, ends[rank][1]
    for _, err in ends:
        assert not [n for n in NOISE if n in err], err

"""Clean failures: a peer's Ctrl-C is named as such, and no rank prints asyncio's noise.

Two ranks started by hand (``interrupt_main.py``) wait in a receive from each
other; the test interrupts or kills one once both printed ``ready`` and reads
what the other says.
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
         "unclosed transport")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_pair() -> list[subprocess.Popen]:
    port = str(_free_port())
    procs = []
    for rank in range(2):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "RANK": str(rank), "WORLD_SIZE": "2"}
        for name in ("ASYNCDIST_STORE_ADDR", "TORCHELASTIC_USE_AGENT_STORE", "ASYNCDIST_SECRET", "ASYNCDIST_JOB_ID"):
            env.pop(name, None)
        procs.append(subprocess.Popen([sys.executable, str(SCRIPT)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    for proc in procs:  # a line each, within the ranks' own timeout
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return procs


@pytest.mark.parametrize("signum, wording", [(signal.SIGINT, "rank 1 was interrupted (SIGINT)"),
                                              (signal.SIGKILL, "rank 1")])
def test_a_peer_that_is_stopped_is_named_and_nobody_prints_noise(signum: int, wording: str) -> None:
    procs = _start_pair()
    try:
        procs[1].send_signal(signum)
        out0, err0 = procs[0].communicate(timeout=60)
        _, err1 = procs[1].communicate(timeout=60)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    result = json.loads(out0.splitlines()[-1])
    assert result["error"] == "PeerLostError" and result["message"].startswith(wording), result
    if signum == signal.SIGINT:
        assert "closed its process group" not in result["message"]
    for err in (err0, err1):
        assert not [n for n in NOISE if n in err], err

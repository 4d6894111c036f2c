"""Init says what it is waiting for: where, for whom, and how long it has left.

``ASYNCDIST_INIT_REPORT_EVERY`` is set short here, so that the lines come
within a second instead of after 10 s; each test waits for its lines with
the rendezvous's own (short) timeout as the deadline.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asyncdist import init_world
from asyncdist.errors import RendezvousError
from asyncdist.engine.engine import Engine
from asyncdist.rendezvous.waiting import WaitReports, duration
from asyncdist.transport.heartbeat import HeartbeatConfig
from asyncdist.wire.handshake import Identity

INIT_MAIN = Path(__file__).with_name("init_main.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "TORCHELASTIC_USE_AGENT_STORE",
                 "ASYNCDIST_STORE_ADDR", "ASYNCDIST_SECRET", "ASYNCDIST_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_durations_read_as_a_person_says_them() -> None:
    assert [duration(s) for s in (0.4, 10, 60, 1790, 3600, 7500)] == [
        "0 s", "10 s", "1 min", "29 min 50 s", "1 h", "2 h 5 min"]


async def test_a_waiting_rank_says_where_and_for_whom(clean_env, caplog: pytest.LogCaptureFixture) -> None:
    clean_env.setenv("ASYNCDIST_INIT_REPORT_EVERY", "0.3")
    caplog.set_level(logging.WARNING, logger="asyncdist.rendezvous")
    port = _free_port()
    with pytest.raises(RendezvousError, match="timed out"):
        await init_world(f"tcp://127.0.0.1:{port}", rank=0, world_size=4, timeout=1.5)
    lines = [r.getMessage() for r in caplog.records if r.name == "asyncdist.rendezvous"]
    assert len(lines) >= 2, lines  # the first report, and at least one more
    pattern = rf"rank 0: waiting at tcp://127\.0\.0\.1:{port} for ranks \[1, 2, 3\] of 4 \(\d+ s so far; timeout in \d+ s\)"
    assert all(re.fullmatch(pattern, line) for line in lines), lines


async def test_zero_turns_the_reports_off(clean_env, caplog: pytest.LogCaptureFixture) -> None:
    clean_env.setenv("ASYNCDIST_INIT_REPORT_EVERY", "0")
    caplog.set_level(logging.WARNING, logger="asyncdist.rendezvous")
    with pytest.raises(RendezvousError, match="timed out"):
        await init_world(f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=2, timeout=0.8)
    assert not [r for r in caplog.records if r.name == "asyncdist.rendezvous"]


def test_the_lines_reach_stderr_without_any_logging_set_up() -> None:
    port = _free_port()
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "2",
           "ASYNCDIST_INIT_REPORT_EVERY": "0.3"}
    for name in ("ASYNCDIST_STORE_ADDR", "TORCHELASTIC_USE_AGENT_STORE", "ASYNCDIST_SECRET", "ASYNCDIST_JOB_ID"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, str(INIT_MAIN), "1.5"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert json.loads(done.stdout.splitlines()[-1])["error"] == "RendezvousError", done.stdout
    assert f"rank 0: waiting at tcp://127.0.0.1:{port} for rank 1 of 2 (" in done.stderr, done.stderr


async def test_a_rank_that_cannot_reach_the_store_says_so_and_keeps_trying(
        clean_env, caplog: pytest.LogCaptureFixture) -> None:
    clean_env.setenv("ASYNCDIST_INIT_REPORT_EVERY", "0.3")
    caplog.set_level(logging.WARNING, logger="asyncdist.rendezvous")
    port = _free_port()  # nobody listens on it
    with pytest.raises(RendezvousError, match=f"could not connect to the store at 127.0.0.1:{port} within 1.5 s"):
        await init_world(f"tcp://127.0.0.1:{port}", rank=1, world_size=2, timeout=1.5)
    lines = [r.getMessage() for r in caplog.records if r.name == "asyncdist.rendezvous"]
    assert len(lines) >= 2, lines  # it went on trying after the first report
    pattern = (rf"rank 1: cannot reach the store at tcp://127\.0\.0\.1:{port}: \[Errno \d+\] Connection refused; "
               r"retrying \(\d+ s so far; timeout in \d+ s\)")
    assert all(re.fullmatch(pattern, line) for line in lines), lines


async def test_a_rank_waiting_for_peers_to_connect_says_for_whom(caplog: pytest.LogCaptureFixture) -> None:
    # Every address is in the store, but rank 2 never dials in (a firewall, a
    # wrong ASYNCDIST_HOST): rank 0 says whom it waits for, in the reports' rhythm.
    caplog.set_level(logging.WARNING, logger="asyncdist.rendezvous")
    engine = Engine(Identity("job", 0, 3, b"secret"), heartbeat=HeartbeatConfig(0, 0))
    one = Engine(Identity("job", 1, 3, b"secret"), heartbeat=HeartbeatConfig(0, 0))
    try:
        address = await engine.listen("127.0.0.1")
        await one.listen("127.0.0.1")
        start = time.monotonic()
        reports = WaitReports(0, 3, "tcp://127.0.0.1:1234", start, start + 1.2,
                              environ={"ASYNCDIST_INIT_REPORT_EVERY": "0.3"})
        one_joins = asyncio.ensure_future(one.connect({0: address}, 1.2))
        with pytest.raises(RendezvousError, match=r"rank 0: ranks \[2\] did not connect within 1\.2 s"):
            await engine.connect({}, 1.2, reports)
        with pytest.raises(RendezvousError, match=r"rank 1: ranks \[2\] did not connect"):
            await one_joins
    finally:
        await asyncio.gather(engine.close(), one.close())
    lines = [r.getMessage() for r in caplog.records if r.name == "asyncdist.rendezvous"]
    assert len(lines) >= 2, lines  # at 0.3 s, then every 0.3 s until the timeout
    pattern = (r"rank 0: waiting at tcp://127\.0\.0\.1:1234 for rank 2 of 3 to connect "
               r"\(\d+ s so far; timeout in \d+ s\)")
    assert all(re.fullmatch(pattern, line) for line in lines), lines

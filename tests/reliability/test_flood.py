"""A flood of connections that never authenticate: the job carries on, the log stays short.

A separate process opens 2,000 connections to rank 0's peer port (silent, a
partial message, half-closed, a handshake dribbled one byte at a time; see
``flood_main.py``) while the three ranks of a job run all_reduces. Rank 0
keeps at most 64 of them in the handshake, drops each after 5 s, and logs a
few in full and then summaries; its heartbeats keep flowing, so no rank is
dropped (the heartbeat timeout is short here: 3 s).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from asyncdist.testing import local_world
from asyncdist.transport.heartbeat import INTERVAL_ENV, TIMEOUT_ENV
from asyncdist.transport.mesh import MAX_PENDING_HANDSHAKES

FLOOD_MAIN = Path(__file__).with_name("flood_main.py")
CONNECTIONS = 2000
HOLD_SECONDS = 7.0  # past the 5 s handshake deadline, so some connections time out too


@pytest.mark.timeout(60)
async def test_a_connection_flood_does_not_take_a_rank_down(monkeypatch, caplog) -> None:
    monkeypatch.setenv(INTERVAL_ENV, "0.5")
    monkeypatch.setenv(TIMEOUT_ENV, "3")
    with caplog.at_level(logging.INFO, logger="asyncdist"):
        async with local_world(3) as ranks:
            start = len(caplog.records)
            host, port = ranks[0].engine.address
            flood = await asyncio.create_subprocess_exec(
                sys.executable, str(FLOOD_MAIN), host, str(port), str(CONNECTIONS), str(HOLD_SECONDS),
                stdout=asyncio.subprocess.PIPE)
            done = asyncio.ensure_future(flood.communicate())
            calls = 0
            while not done.done() or calls < 3:
                x = [np.full(1000, g.rank + 1.0) for g in ranks]
                await asyncio.wait_for(asyncio.gather(*(g.all_reduce(v) for g, v in zip(ranks, x))), 10)
                assert all((v == 6.0).all() for v in x)
                calls += 1
                pending = len(ranks[0].engine._mesh._pending)
                assert pending <= MAX_PENDING_HANDSHAKES
            out, _ = await done
            assert flood.returncode == 0
            print(out.decode().strip(), f"; {calls} all_reduces during the flood")
            # No rank was dropped: every rank still holds both of its peers.
            assert all(sorted(g.engine._connections) == [r for r in range(3) if r != g.rank] for g in ranks)
            x = [np.full(4, g.rank + 1.0) for g in ranks]
            await asyncio.gather(*(g.all_reduce(v) for g, v in zip(ranks, x)))
            assert all((v == 6.0).all() for v in x)
            refusals = ranks[0].engine._mesh.refusals.total
        lines = [r.getMessage() for r in caplog.records[start:]]
    print(f"{len(lines)} log lines for {sum(refusals.values())} refusals {dict(refusals)}")
    assert sum(refusals.values()) > 1000, dict(refusals)  # the flood did reach rank 0
    assert len(lines) < 50, "\n".join(lines[:60])
    assert not [line for line in lines if "lost rank" in line]


@pytest.mark.timeout(60)
async def test_accept_backs_off_when_descriptors_run_out(caplog) -> None:
    resource = pytest.importorskip("resource")
    with caplog.at_level(logging.INFO, logger="asyncdist"):
        async with local_world(2) as ranks:
            host, port = ranks[0].engine.address
            flood = await asyncio.create_subprocess_exec(
                sys.executable, str(FLOOD_MAIN), host, str(port), "20", "3", stdout=asyncio.subprocess.PIPE)
            done = asyncio.ensure_future(flood.communicate())
            start = len(caplog.records)
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            # No descriptor left for accept: every one fails with EMFILE.
            resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")), hard))
            try:
                loop = asyncio.get_running_loop()
                until = loop.time() + 2.0  # how long to watch, not a synchronisation
                calls = 0
                while loop.time() < until:
                    x = [np.full(4, g.rank + 1.0) for g in ranks]
                    await asyncio.wait_for(asyncio.gather(*(g.all_reduce(v) for g, v in zip(ranks, x))), 10)
                    assert all((v == 3.0).all() for v in x)
                    calls += 1
            finally:
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            failed = ranks[0].engine._mesh.refusals.total["failed accepts"]
            await done
            lines = [r.getMessage() for r in caplog.records[start:]]
    print(f"{failed} failed accepts in 2 s, {calls} all_reduces, {len(lines)} log lines")
    # Backing off from 10 ms, doubling to 1 s: about 8 tries in 2 s (old code: a busy loop).
    assert 1 <= failed <= 20, failed
    assert len(lines) < 20, "\n".join(lines[:40])

"""Misconfiguration is an immediate, clear error on every rank that can know it.

Each rank is a process started by hand (``init_main.py``, env://, rank 0
serving the store), as from its own shell. Every test checks that the error
names the cause and the ranks (or processes) and arrives within a few
seconds, far inside the ranks' own 20 s timeout.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asyncdist import init_world
from asyncdist.errors import RendezvousError

INIT_MAIN = Path(__file__).with_name("init_main.py")
FEW_SECONDS = 8.0  # each error must arrive within this; the ranks' own timeout is 20 s


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASYNCDIST_", "TORCHELASTIC_", "OMPI_", "PMI_",
                                                                     "SLURM_"))}
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    return env


def _run(ranks: list[tuple[str, str]], port: int, extra: dict[str, str] | None = None) -> tuple[list[dict], float]:
    """Start one process per (RANK, WORLD_SIZE); return their results and how long the slowest took."""
    start = time.monotonic()
    procs = []
    for rank, size in ranks:
        env = {**_clean_env(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": rank,
               "WORLD_SIZE": size, **(extra or {})}
        procs.append(subprocess.Popen([sys.executable, str(INIT_MAIN)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            lines = [line for line in out.splitlines() if line.startswith("{")]
            assert lines, f"no result; stderr:\n{err[-3000:]}"
            results.append({**json.loads(lines[-1]), "pid": proc.pid, "stderr": err})
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results, time.monotonic() - start


def test_two_processes_claiming_one_rank_are_both_named() -> None:
    # World size 3 and no rank 2: the job cannot complete before the second claim comes.
    results, took = _run([("0", "3"), ("1", "3"), ("1", "3")], _free_port())
    assert all("error" in r for r in results), results
    duplicates = [r["pid"] for r in results[1:]]
    for r in results:
        assert "rank 1 is claimed by two processes" in r["message"], r
        for pid in duplicates:  # both claimants, by host and pid, on every rank
            assert f"pid {pid} on {socket.gethostname()}" in r["message"], r
    assert took < FEW_SECONDS


def test_ranks_that_disagree_on_world_size_are_named() -> None:
    results, took = _run([("0", "2"), ("1", "3")], _free_port())
    for r in results:
        assert r.get("error") == "RendezvousError", r
        assert "world size mismatch" in r["message"], r
        assert ("rank 1 was started with world_size=3, rank 0 with world_size=2" in r["message"]
                or "rank 0 was started with world_size=2, rank 1 with world_size=3" in r["message"]), r
    assert took < FEW_SECONDS


@pytest.mark.parametrize("bad_rank, cause", [("2", "is out of range"), ("-1", "is negative")])
def test_an_impossible_rank_fails_itself_and_the_others(bad_rank: str, cause: str) -> None:
    results, took = _run([("0", "2"), (bad_rank, "2")], _free_port())
    waiting, bad = results
    assert bad.get("error") == "InvalidRankError", bad
    assert f"rank {bad_rank} {cause}: it must be in [0, 2)" in bad["message"], bad
    assert waiting.get("error") == "RendezvousError", waiting
    assert f"rank {bad_rank} {cause}" in waiting["message"], waiting
    assert f"pid {bad['pid']} on" in waiting["message"], waiting  # who, so it can be found
    assert took < FEW_SECONDS


async def test_a_master_addr_that_does_not_resolve(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"MASTER_ADDR": "no-such-host.invalid", "MASTER_PORT": "29500", "RANK": "1",
                        "WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("ASYNCDIST_STORE_ADDR", raising=False)
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    start = time.monotonic()
    with pytest.raises(RendezvousError, match=r"rank 1: MASTER_ADDR 'no-such-host.invalid' does not resolve"):
        await init_world(timeout=20)
    assert time.monotonic() - start < FEW_SECONDS

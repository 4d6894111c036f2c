"""Rendezvous errors: each one a clear error, raised within the timeout.

Port in use, an unreachable master, missing environment variables, init
called twice, a world size mismatch, a duplicate rank and a rank that never
comes: every rank involved raises RendezvousError (or the facade's
AlreadyInitializedError) saying what is wrong, well before a hang could be
suspected.
"""

from __future__ import annotations

import asyncio
import socket
import time
from datetime import timedelta

import numpy as np
import pytest

import asyncdist as dist
from asyncdist import init_world
from asyncdist.errors import AlreadyInitializedError, RendezvousError
from asyncdist.rendezvous.hash_store import HashStore

TIMEOUT = 2.0


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nobody listens on it once closed


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "TORCHELASTIC_USE_AGENT_STORE",
                 "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID",
                 "SLURM_NTASKS", "ASYNCDIST_SECRET", "ASYNCDIST_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


async def _timed(coro) -> tuple[BaseException, float]:
    start = time.monotonic()
    with pytest.raises(Exception) as info:
        await coro
    return info.value, time.monotonic() - start


async def test_port_in_use(clean_env) -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        error, took = await _timed(init_world(f"tcp://127.0.0.1:{port}", rank=0, world_size=2, timeout=TIMEOUT))
    assert isinstance(error, RendezvousError), repr(error)
    assert f"rank 0: cannot use the store at 127.0.0.1:{port}" in str(error)
    assert "cannot listen" in str(error) and "in use" in str(error)
    assert took < 1


async def test_unreachable_master_fails_within_the_timeout(clean_env) -> None:
    port = _unused_port()
    error, took = await _timed(init_world(f"tcp://127.0.0.1:{port}", rank=1, world_size=2, timeout=TIMEOUT))
    assert isinstance(error, RendezvousError), repr(error)
    assert f"could not connect to the store at 127.0.0.1:{port} within {TIMEOUT:g} s" in str(error)
    assert TIMEOUT * 0.9 <= took < TIMEOUT + 2


@pytest.mark.parametrize("missing", [["MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"], ["MASTER_PORT"], ["RANK"]])
async def test_missing_environment_variables_are_named(clean_env, missing: list[str]) -> None:
    values = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_unused_port()), "RANK": "1", "WORLD_SIZE": "2"}
    for name, value in values.items():
        if name not in missing:
            clean_env.setenv(name, value)
    error, took = await _timed(init_world(timeout=TIMEOUT))
    assert isinstance(error, RendezvousError), repr(error)
    assert str(error).endswith("not set: " + ", ".join(missing)), str(error)
    assert took < 1


async def test_a_malformed_variable_is_named(clean_env) -> None:
    clean_env.setenv("MASTER_ADDR", "127.0.0.1")
    clean_env.setenv("MASTER_PORT", "twenty-nine-thousand")
    clean_env.setenv("RANK", "0")
    clean_env.setenv("WORLD_SIZE", "1")
    error, _ = await _timed(init_world(timeout=TIMEOUT))
    assert isinstance(error, RendezvousError) and "MASTER_PORT must be an integer" in str(error)


async def test_world_size_mismatch_fails_every_rank_at_once() -> None:
    store = HashStore()
    start = time.monotonic()
    results = await asyncio.gather(
        init_world(store=store, rank=0, world_size=2, timeout=10),
        init_world(store=store, rank=1, world_size=3, timeout=10),
        return_exceptions=True,
    )
    took = time.monotonic() - start
    store.close()
    assert all(isinstance(r, RendezvousError) for r in results), results
    assert all("world size mismatch" in str(r) for r in results), results
    assert took < 3  # the abort key, not the 10 s timeout


async def test_the_same_rank_twice_fails_both() -> None:
    store = HashStore()
    results = await asyncio.gather(
        *(init_world(store=store, rank=0, world_size=2, timeout=10) for _ in range(2)), return_exceptions=True
    )
    store.close()
    assert all(isinstance(r, RendezvousError) for r in results), results
    assert all("rank 0 is claimed by two processes" in str(r) for r in results), results


async def test_a_rank_that_never_comes_fails_the_others_within_the_timeout() -> None:
    store = HashStore()
    error, took = await _timed(init_world(store=store, rank=0, world_size=2, timeout=1.0))
    store.close()
    assert isinstance(error, RendezvousError)
    assert "timed out waiting for the addresses of all ranks" in str(error) and "rank/1/address" in str(error)
    assert 1.0 <= took < 3


def test_init_process_group_twice(clean_env) -> None:
    url = f"tcp://127.0.0.1:{_unused_port()}"
    dist.init_process_group(init_method=url, rank=0, world_size=1, timeout=timedelta(seconds=10))
    try:
        with pytest.raises(AlreadyInitializedError, match="twice"):
            dist.init_process_group(init_method=url, rank=0, world_size=1)
        x = np.ones(2)
        dist.all_reduce(x)  # the first one still works
        assert x.tolist() == [1.0, 1.0]
    finally:
        dist.destroy_process_group()
    assert not dist.is_initialized()


def test_facade_port_in_use_leaves_nothing_initialized(clean_env) -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        clean_env.setenv("MASTER_ADDR", "127.0.0.1")
        clean_env.setenv("MASTER_PORT", str(port))
        clean_env.setenv("RANK", "0")
        clean_env.setenv("WORLD_SIZE", "2")
        with pytest.raises(RendezvousError, match="in use"):
            dist.init_process_group(timeout=timedelta(seconds=TIMEOUT))
    assert not dist.is_initialized()

"""``TorchStore`` (asyncdist's Store API over a torch store) and the choice of
store client under a launcher's agent store: in one process, no ranks."""

from __future__ import annotations

import socket
import time
from datetime import timedelta

import pytest

from asyncdist.errors import ClosedError, RendezvousError, StoreError, StoreTimeoutError
from asyncdist.rendezvous.init_method import resolve
from asyncdist.rendezvous.torch_store import TorchStore, agent_store_is_torchs, torch_store_client

tdist = pytest.importorskip("torch.distributed")


@pytest.fixture
def master():
    store = tdist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    yield store


def test_the_store_api_maps_onto_torchs_with_torchs_answers(master) -> None:
    store = TorchStore(tdist.PrefixStore("job", master))
    store.set("a", "1")
    assert store.get("a") == b"1" and master.get("job/a") == b"1"
    assert store.add("n", 2) == 2 and store.add("n", 3) == 5
    assert store.compare_set("c", "", "x") == b"x"
    assert store.compare_set("c", "y", "z") == b"x"  # mismatch: the current value
    assert store.compare_set("missing", "y", "z") == b"y"  # missing: the expected value (torch's rule)
    assert store.check(["a", "n"]) and not store.check(["a", "nope"])
    assert store.delete_key("a") and not store.delete_key("a")
    assert store.num_keys() >= 2
    assert store.host == "127.0.0.1" and store.port == master.port
    assert store.timeout == timedelta(seconds=5)


def test_get_and_wait_time_out_with_asyncdists_error_naming_the_keys(master) -> None:
    store = TorchStore(master)
    store.set("early", "1")
    start = time.monotonic()
    with pytest.raises(StoreTimeoutError, match=r"\['late'\] were not set within 0.2 s"):
        store.wait(["late", "early"], timedelta(seconds=0.2))
    assert time.monotonic() - start < 2
    store.set_timeout(timedelta(seconds=0.2))
    assert master.timeout == timedelta(seconds=0.2)
    with pytest.raises(StoreTimeoutError, match="'late' was not set"):
        store.get("late")


async def test_async_twins_see_keys_set_by_another_client(master) -> None:
    store = TorchStore(master)
    other = torch_store_client("127.0.0.1", master.port, timeout=5)
    other.set("k", b"v")
    await store.async_wait(["k"], 1.0)
    assert await store.async_get("k") == b"v"
    other.close()
    with pytest.raises(ClosedError):
        other.get("k")


def test_a_torch_error_becomes_a_store_error() -> None:
    class Broken:
        timeout = timedelta(seconds=1)

        def set(self, key, value):
            raise RuntimeError("Connection reset by peer")

    with pytest.raises(StoreError, match="torch Broken.set: Connection reset by peer") as info:
        TorchStore(Broken()).set("k", "v")
    assert isinstance(info.value.__cause__, RuntimeError)


@pytest.mark.parametrize(
    ("environ", "torchs"),
    [
        ({"TORCHELASTIC_RUN_ID": "none"}, True),  # torchrun: its run id, none of asyncdist-run's variables
        ({"TORCHELASTIC_RUN_ID": "j", "ASYNCDIST_SECRET": "s", "ASYNCDIST_JOB_ID": "j"}, False),  # asyncdist-run
        ({"TORCHELASTIC_RUN_ID": "j", "ASYNCDIST_JOB_ID": "j"}, False),
        ({}, False),  # a launcher that is neither
        ({"ASYNCDIST_SECRET": "s", "ASYNCDIST_AGENT_STORE": "torch"}, True),  # said outright
        ({"ASYNCDIST_AGENT_STORE": "Asyncdist"}, False),
    ],
)
def test_whose_agent_store(environ: dict, torchs: bool) -> None:
    assert agent_store_is_torchs(environ) is torchs


def test_a_bad_agent_store_kind_is_refused() -> None:
    with pytest.raises(RendezvousError, match="ASYNCDIST_AGENT_STORE must be 'torch' or 'asyncdist'"):
        agent_store_is_torchs({"ASYNCDIST_AGENT_STORE": "gloo"})


def test_env_rendezvous_joins_torchruns_store_with_torchs_client(master) -> None:
    environ = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master.port), "RANK": "1", "WORLD_SIZE": "2",
               "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "3",
               "TORCHELASTIC_RUN_ID": "none"}
    plan = resolve("env://", timeout=5, environ=environ)
    try:
        assert (plan.rank, plan.world_size, plan.owns_store) == (1, 2, True)
        assert isinstance(plan.store.underlying_store, TorchStore)
        plan.store.set("x", "1")
        assert master.get("/worker/attempt_3/x") == b"1"  # the restart attempt's prefix, as before
    finally:
        plan.store.close()


def test_when_asyncdists_client_cannot_reach_the_agent_store_the_error_names_the_switch() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    environ = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "1", "WORLD_SIZE": "2",
               "TORCHELASTIC_USE_AGENT_STORE": "True", "ASYNCDIST_SECRET": "s"}
    with pytest.raises(RendezvousError, match="set ASYNCDIST_AGENT_STORE=torch"):
        resolve("env://", timeout=0.5, environ=environ)

"""Rank and world size from srun / mpirun variables, and env:// under a launcher's store."""

from __future__ import annotations

import numpy as np
import pytest

import asyncdist as dist
from asyncdist.errors import ClosedError, RendezvousError
from asyncdist.rendezvous.init_method import parse_store_address, resolve, store_address
from asyncdist.rendezvous.environments import AttemptStore, Placement, local_rank_from_env, placement
from asyncdist.rendezvous.tcp_store import TCPStore

SLURM = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
         "SLURM_NODEID": "1", "SLURM_TASKS_PER_NODE": "4(x2)"}
OMPI = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "6",
        "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "3"}
PMI = {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "4"}
TORCHRUN = {"RANK": "7", "WORLD_SIZE": "16", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8"}

# Everything that could leak from the environment the tests run in.
LAUNCH_VARS = [*SLURM, *OMPI, *PMI, *TORCHRUN, "SLURM_NPROCS", "TORCHELASTIC_USE_AGENT_STORE",
               "TORCHELASTIC_RESTART_COUNT", "ASYNCDIST_SECRET", "ASYNCDIST_JOB_ID", "ASYNCDIST_HOST",
               "ASYNCDIST_STORE_ADDR", "ASYNCDIST_AGENT_STORE"]


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        (SLURM, Placement("SLURM", 5, 8, 1, 4)),
        (OMPI, Placement("Open MPI", 3, 6, 0, 3)),
        (PMI, Placement("MPICH/Intel MPI", 2, 4, 2, 4)),
        (TORCHRUN, Placement("torchrun", 7, 16, 3, 8)),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}, Placement("SLURM", 0, 1, None, None)),
        ({"PMI_RANK": "1", "PMI_SIZE": "2"}, Placement("MPICH/Intel MPI", 1, 2, None, None)),
    ],
    ids=["slurm", "openmpi", "mpich", "torchrun", "slurm-minimal", "pmi-minimal"],
)
def test_each_launcher_maps_to_rank_and_size(environ: dict[str, str], expected: Placement) -> None:
    assert placement(environ) == expected


def test_precedence_torchrun_then_mpi_then_slurm() -> None:
    # mpirun inside a SLURM allocation: SLURM_PROCID is the daemon's node index, not the rank.
    assert placement({**SLURM, **OMPI}).source == "Open MPI"
    assert placement({**SLURM, **PMI}).source == "MPICH/Intel MPI"
    assert placement({**SLURM, **OMPI, **TORCHRUN}).source == "torchrun"


def test_a_launcher_needs_rank_and_size_together() -> None:
    assert placement({}) is None
    assert placement({"RANK": "1", "SLURM_PROCID": "2"}) is None
    # RANK without WORLD_SIZE is not a torchrun placement; SLURM's pair is used instead.
    assert placement({"RANK": "1", **SLURM}) == Placement("SLURM", 5, 8, 1, 4)


@pytest.mark.parametrize(
    ("tasks_per_node", "node", "expected"),
    [("4(x2),3", "0", 4), ("4(x2),3", "1", 4), ("4(x2),3", "2", 3), ("2,1", "1", 1),
     ("4(x2)", "5", None), ("weird[1-3]", "0", None)],
)
def test_slurm_local_world_size(tasks_per_node: str, node: str, expected: int | None) -> None:
    environ = {"SLURM_PROCID": "0", "SLURM_NTASKS": "11", "SLURM_NODEID": node, "SLURM_TASKS_PER_NODE": tasks_per_node}
    assert placement(environ).local_world_size == expected


def test_bad_value_names_the_variable() -> None:
    with pytest.raises(RendezvousError, match="SLURM_NTASKS must be an integer, got 'eight'"):
        placement({"SLURM_PROCID": "1", "SLURM_NTASKS": "eight"})


def test_local_rank_from_env() -> None:
    assert local_rank_from_env({}) is None
    assert local_rank_from_env(SLURM) == 1
    assert local_rank_from_env(PMI) == 2
    assert local_rank_from_env({**SLURM, **OMPI}) == 0
    assert local_rank_from_env({**SLURM, "LOCAL_RANK": "6"}) == 6
    with pytest.raises(RendezvousError, match="MPI_LOCALRANKID"):
        local_rank_from_env({"MPI_LOCALRANKID": "x"})


def test_env_resolve_uses_slurm_variables() -> None:
    environ = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"}
    plan = resolve("env://", timeout=10.0, environ=environ)
    try:
        assert (plan.rank, plan.world_size, plan.host, plan.owns_store) == (0, 1, "127.0.0.1", True)
        assert isinstance(plan.store, TCPStore)  # rank 0 serves it: no launcher store here
    finally:
        plan.store.close()


def test_env_resolve_explicit_rank_wins_over_slurm() -> None:
    environ = {**SLURM, "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"}
    plan = resolve("env://", timeout=10.0, environ=environ)
    plan.store.close()
    assert (plan.rank, plan.world_size) == (0, 1)


def test_env_resolve_names_launcher_variables_when_nothing_is_set() -> None:
    with pytest.raises(RendezvousError) as info:
        resolve("env://", timeout=1.0, environ={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"})
    message = str(info.value)
    assert "not set: RANK, WORLD_SIZE" in message
    assert "SLURM_PROCID/SLURM_NTASKS" in message and "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE" in message


def test_agent_store_is_scoped_to_the_restart_attempt() -> None:
    agent = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    try:
        environ = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(agent.port),
                   "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "2"}
        plan = resolve("env://", timeout=10.0, environ=environ)
        assert isinstance(plan.store, AttemptStore)
        plan.store.set("rank/0/claims", "1")
        assert agent.get("/worker/attempt_2/rank/0/claims") == b"1"
        assert not agent.check(["rank/0/claims"])
        plan.store.close()
        with pytest.raises(ClosedError):  # closing the plan's store closes the worker's connection
            plan.store.underlying_store.get("still")
        agent.set("still", "served")  # closing a worker's store leaves the launcher's alone
        assert agent.get("still") == b"served"
    finally:
        agent.close()


def test_launchers_own_store_is_preferred_to_master_port() -> None:
    """ASYNCDIST_STORE_ADDR (asyncdist-run beside torch's store) wins over MASTER_ADDR:MASTER_PORT,
    which then need not even be set; the store is still scoped to the attempt and authenticated."""
    agent = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, secret="s3cret")
    try:
        environ = {"RANK": "0", "WORLD_SIZE": "1", "TORCHELASTIC_USE_AGENT_STORE": "True",
                   "TORCHELASTIC_RESTART_COUNT": "1", "ASYNCDIST_STORE_ADDR": store_address("127.0.0.1", agent.port)}
        for extra in ({}, {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}):  # port 1: nothing listens there
            with pytest.MonkeyPatch.context() as patch:
                patch.setenv("ASYNCDIST_SECRET", "s3cret")  # the client reads the job's secret from here
                plan = resolve("env://", timeout=10.0, environ={**environ, **extra})
            try:
                assert isinstance(plan.store, AttemptStore) and plan.host == "127.0.0.1"
                plan.store.set("k", "v")
                assert agent.get("/worker/attempt_1/k") == b"v"
            finally:
                plan.store.close()
    finally:
        agent.close()


@pytest.mark.parametrize(("text", "expected"), [("node0:29400", ("node0", 29400)), ("[::1]:7", ("::1", 7)),
                                                ("10.0.0.1:65535", ("10.0.0.1", 65535))])
def test_store_address_round_trips(text: str, expected: tuple[str, int]) -> None:
    assert parse_store_address(text) == expected
    assert store_address(*expected) == text


@pytest.mark.parametrize("text", ["node0", "node0:", ":29400", "node0:http", "node0:0", "node0:70000"])
def test_a_bad_store_address_names_the_variable(text: str) -> None:
    with pytest.raises(RendezvousError, match="ASYNCDIST_STORE_ADDR must be host:port"):
        resolve("env://", timeout=1.0, environ={"RANK": "0", "WORLD_SIZE": "1", "ASYNCDIST_STORE_ADDR": text})


def test_init_process_group_under_srun(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)
    for name, value in {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"}.items():
        monkeypatch.setenv(name, value)
    dist.init_process_group(init_method="env://")
    try:
        assert (dist.get_rank(), dist.get_world_size()) == (0, 1)
        data = np.arange(4.0)
        dist.all_reduce(data)
        assert data.tolist() == [0.0, 1.0, 2.0, 3.0]
    finally:
        dist.destroy_process_group()
    assert not dist.is_initialized()

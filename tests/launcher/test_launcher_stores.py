"""The stores a launcher serves (``asyncdist.launcher.stores``), in process: which, where, how they close.

With torch, torch's TCPStore is at MASTER_PORT for torch scripts and
asyncdist's authenticated store at ASYNCDIST_STORE_ADDR; without torch (or
with ASYNCDIST_AGENT_STORE=asyncdist), asyncdist's alone at MASTER_PORT.
The end-to-end runs are in ``test_run.py`` and
``tests/torch_backend/test_torch_launchers.py``.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest

from asyncdist.errors import StoreError
from asyncdist.launcher import stores as stores_module
from asyncdist.launcher.args import LaunchConfig
from asyncdist.launcher.job import Job, LaunchError
from asyncdist.rendezvous.init_method import parse_store_address
from asyncdist.rendezvous.tcp_store import TCPStore

SECRET = "test-secret"
ENV = {"ASYNCDIST_SECRET": SECRET, "PATH": "/usr/bin"}


def _config(**changes: object) -> LaunchConfig:
    fields = {"command": (sys.executable, "job.py"), "nproc_per_node": 2, "master_port": 0, "standalone": True}
    return LaunchConfig(**{**fields, **changes})  # type: ignore[arg-type]


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return False
    return True


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_with_torch_master_port_is_torchs_and_asyncdists_store_is_beside_it() -> None:
    torch = pytest.importorskip("torch")
    job = Job(_config(), ENV)
    try:
        env = job.worker_env(0, restart_count=0)
        assert env["ASYNCDIST_AGENT_STORE"] == "torch" and env["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        host, port = parse_store_address(env["ASYNCDIST_STORE_ADDR"])
        assert (host, env["MASTER_ADDR"]) == ("127.0.0.1", "127.0.0.1")
        assert port != int(env["MASTER_PORT"]) == job.port != 0
        # torch's own client speaks to MASTER_PORT, as a torch script's env:// does.
        client = torch.distributed.TCPStore("127.0.0.1", job.port, is_master=False, timeout=timedelta(seconds=10),
                                            wait_for_workers=False)
        client.set("/worker/attempt_0/k", "torch")
        on_demand = job.stores.torch_store
        assert isinstance(on_demand, stores_module.TorchStoreOnDemand)  # started by the client's connection
        assert on_demand.server().get("/worker/attempt_0/k") == b"torch"
        del client
        # asyncdist's store serves the job's secret only.
        with pytest.raises(StoreError):
            TCPStore(host, port, timeout=timedelta(seconds=5), wait_for_workers=False, secret="not-the-secret")
        worker = TCPStore(host, port, timeout=timedelta(seconds=5), wait_for_workers=False, secret=SECRET)
        worker.set("k", "asyncdist")
        worker.close()
        assert job.store.get("k") == b"asyncdist"
    finally:
        job.close()
    assert not _listening(job.port) and not _listening(port)  # both servers stopped
    job.close()  # idempotent


def _listen_addresses(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp* shows them) on which ``port`` is listened on."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's socket tables")
def test_on_one_node_torchs_store_listens_on_the_master_address_only() -> None:
    """torch alone would listen on every interface; the launcher binds 127.0.0.1 (--standalone)."""
    pytest.importorskip("torch")
    job = Job(_config(), ENV)
    try:
        assert _listen_addresses(job.port) == {"0100007F"}  # 127.0.0.1
        assert job.begin_attempt(1, timeout=1.0)
        assert _listen_addresses(job.port) == {"0100007F"}  # served afresh, bound the same way
    finally:
        job.close()
    assert _listen_addresses(job.port) == set()


ON_DEMAND = """
import sys
from datetime import timedelta
from asyncdist.launcher.args import LaunchConfig
from asyncdist.launcher.job import Job
job = Job(LaunchConfig(command=(sys.executable, "job.py"), nproc_per_node=2, master_port=0, standalone=True),
          {"ASYNCDIST_SECRET": "s", "PATH": "/usr/bin"})
print("torch" in sys.modules)  # nothing asked for torch's store yet
import torch.distributed       # a torch script's env:// connects to MASTER_PORT
client = torch.distributed.TCPStore("127.0.0.1", job.port, is_master=False, timeout=timedelta(seconds=60),
                                    wait_for_workers=False)
client.set("k", "from a torch client")
print(job.stores.torch_store.server().get("k").decode())
del client
job.close()
"""


def test_torchs_store_starts_when_its_first_client_connects_and_not_before() -> None:
    """A job of asyncdist scripts never connects to MASTER_PORT: its launcher never imports torch."""
    pytest.importorskip("torch")
    result = subprocess.run([sys.executable, "-c", ON_DEMAND], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["False", "from a torch client"]


def test_without_torch_asyncdists_store_alone_is_at_master_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stores_module, "torch_installed", lambda: False)
    job = Job(_config(), {**ENV, "ASYNCDIST_STORE_ADDR": "127.0.0.1:1"})  # inherited from an outer job
    try:
        env = job.worker_env(1, restart_count=0)
        assert env["ASYNCDIST_AGENT_STORE"] == "asyncdist" and "ASYNCDIST_STORE_ADDR" not in env
        assert job.stores.torch_store is None and job.store.port == job.port == int(env["MASTER_PORT"])
        worker = TCPStore("127.0.0.1", job.port, timeout=timedelta(seconds=5), wait_for_workers=False, secret=SECRET)
        worker.set("k", "v")
        worker.close()
    finally:
        job.close()
    assert not _listening(job.port)


@pytest.mark.parametrize(("value", "message"), [("torch", "torch is not installed"), ("gloo", "must be 'torch' or")])
def test_a_store_kind_that_cannot_be_served_is_a_launch_error(monkeypatch: pytest.MonkeyPatch, value: str,
                                                               message: str) -> None:
    monkeypatch.setattr(stores_module, "torch_installed", lambda: False)
    with pytest.raises(LaunchError, match=message):
        Job(_config(), {**ENV, "ASYNCDIST_AGENT_STORE": value})


def test_torch_store_port_in_use_is_a_launch_error() -> None:
    pytest.importorskip("torch")
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(LaunchError, match=f"cannot serve the job's store on 127.0.0.1:{port}"):
            Job(_config(master_port=port, standalone=False), ENV)


def test_other_nodes_find_asyncdists_store_through_torchs() -> None:
    """Node 1's launcher waits for node 0, reads the port of asyncdist's store from torch's
    store, and both run the exit barrier on asyncdist's store."""
    pytest.importorskip("torch")
    port = _free_port()
    configs = [_config(nnodes=2, node_rank=rank, master_port=port, standalone=False, run_id="j") for rank in (0, 1)]
    joined: list[Job | BaseException] = []

    def node_one() -> None:  # started first: it must wait for node 0
        try:
            joined.append(Job(configs[1], ENV))
        except BaseException as exc:
            joined.append(exc)

    thread = threading.Thread(target=node_one)
    thread.start()
    node0 = Job(configs[0], ENV)
    try:
        thread.join(timeout=60)
        node1 = joined[0]
        assert isinstance(node1, Job), node1
        try:
            env0, env1 = node0.worker_env(0, 0), node1.worker_env(0, 0)
            assert env0["ASYNCDIST_STORE_ADDR"] == env1["ASYNCDIST_STORE_ADDR"]
            assert env0["MASTER_PORT"] == env1["MASTER_PORT"] == str(port)
            assert (env0["RANK"], env1["RANK"]) == ("0", "2")
            done = threading.Thread(target=node1.finish)
            done.start()
            node0.finish(timeout=timedelta(seconds=60))  # returns once both nodes checked in
            done.join(timeout=60)
            assert node0.store.get("asyncdist-run/nodes_done") == b"2"
        finally:
            node1.close()
    finally:
        node0.close()


def test_node_zero_never_coming_up_is_a_launch_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """The other nodes wait for node 0's port in Python (Ctrl-C works), then give up."""
    pytest.importorskip("torch")
    monkeypatch.setattr(stores_module, "JOIN_TIMEOUT", timedelta(seconds=0.5))
    port = _free_port()  # nothing listens there
    with pytest.raises(LaunchError, match=f"cannot reach node 0's store at 127.0.0.1:{port} within 0.5 s"):
        Job(_config(nnodes=2, node_rank=1, master_port=port, standalone=False), ENV)


def test_torch_store_is_served_afresh_on_the_same_port_for_a_restart() -> None:
    """torch's env:// does not scope keys per attempt: a restarted gloo group would read the last
    attempt's addresses. So each restart gets an empty torch store at the same MASTER_PORT."""
    torch = pytest.importorskip("torch")
    job = Job(_config(), ENV)
    try:
        port = job.port
        assert isinstance(job.stores.torch_store, stores_module.TorchStoreOnDemand)
        job.stores.torch_store.server().set("default_pg/0//cpu//rank_1", "attempt 0's address")
        job.store.set("/worker/attempt_0/k", "kept")
        assert job.begin_attempt(0, timeout=1.0)  # the first attempt: nothing to do
        assert job.stores.torch_store.server().check(["default_pg/0//cpu//rank_1"])
        assert job.begin_attempt(1, timeout=1.0)
        assert job.port == port == int(job.worker_env(0, 1)["MASTER_PORT"])
        client = torch.distributed.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10),
                                            wait_for_workers=False)
        assert not client.check(["default_pg/0//cpu//rank_1"])
        del client
        assert job.store.get("/worker/attempt_0/k") == b"kept"  # asyncdist's store persists
    finally:
        job.close()
    assert not _listening(port)


def test_other_nodes_start_a_restart_only_once_node_zero_renewed_torchs_store() -> None:
    pytest.importorskip("torch")
    port = _free_port()
    configs = [_config(nnodes=2, node_rank=rank, master_port=port, standalone=False, run_id="j") for rank in (0, 1)]
    node0 = Job(configs[0], ENV)
    try:
        node1 = Job(configs[1], ENV)
        try:
            assert node1.begin_attempt(0, timeout=0.1)
            assert not node1.begin_attempt(1, timeout=0.1)  # node 0 has not restarted yet
            assert node0.begin_attempt(1, timeout=0.1)
            assert node1.begin_attempt(1, timeout=5.0)
            assert not node1.begin_attempt(2, timeout=0.1)
        finally:
            node1.close()
    finally:
        node0.close()


def test_a_launcher_waiting_for_node_0_says_so(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("ASYNCDIST_INIT_REPORT_EVERY", "0.3")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nobody listens on it once closed
    with pytest.raises(LaunchError, match=f"cannot reach node 0's store at 127.0.0.1:{port} within 1.2 s"):
        stores_module._wait_for_listener("127.0.0.1", port, 1.2)
    lines = [line for line in capsys.readouterr().err.splitlines() if "waiting for node 0" in line]
    assert len(lines) >= 2, lines
    assert lines[0].startswith(f"asyncdist-run: waiting for node 0's store at 127.0.0.1:{port}: "), lines
    assert "Connection refused; retrying (" in lines[0] and "so far; timeout in" in lines[0], lines


def test_a_launcher_without_torch_waiting_for_node_0_says_so_too(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """With asyncdist's store as the agent store (no torch), a node other than 0 said
    nothing until node 0 came up or the join timed out."""
    monkeypatch.setenv("ASYNCDIST_INIT_REPORT_EVERY", "0.3")
    monkeypatch.setattr(stores_module, "JOIN_TIMEOUT", timedelta(seconds=1.2))
    port = _free_port()  # nobody listens on it
    config = _config(nnodes=2, node_rank=1, master_port=port, standalone=False, run_id="j")
    with pytest.raises(LaunchError, match=f"cannot reach node 0's store at 127.0.0.1:{port} within 1.2 s"):
        stores_module.open_stores(config, "secret", "asyncdist")
    lines = [line for line in capsys.readouterr().err.splitlines() if "waiting for node 0" in line]
    assert len(lines) >= 2 and lines[0].startswith(f"asyncdist-run: waiting for node 0's store at 127.0.0.1:{port}: ")

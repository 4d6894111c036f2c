"""The blocking facade with real rank processes over loopback sockets."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import asyncdist as dist
from asyncdist.errors import BufferMismatchError, PeerLostError, RendezvousError
from asyncdist.testing import spawn

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]


# -- rank bodies (module level: they run in the rank processes) --------------


def ring_of_tensors() -> list[float]:
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    out = torch.full((5,), float(rank), dtype=torch.float64)
    got = torch.zeros(5, dtype=torch.float64)
    if rank % 2 == 0:  # even ranks send first, odd ranks receive first: no deadlock for any size
        dist.send(out, (rank + 1) % size)
        dist.recv(got, (rank - 1) % size)
    else:
        dist.recv(got, (rank - 1) % size)
        dist.send(out, (rank + 1) % size)
    return got.tolist()


def nonblocking_fan_in() -> tuple[int, list[int]]:
    dist.init_process_group()
    rank, size = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        senders = []
        for _ in range(size - 1):
            buf = torch.zeros(3, dtype=torch.int32)
            work = dist.irecv(buf)  # from any rank
            work.wait()
            senders.append((int(buf[0]), work.source_rank()))
        return rank, sorted(senders)
    work = dist.isend(torch.full((3,), rank, dtype=torch.int32), dst=0)
    assert work.wait() is True and work.is_completed() and work.is_success()
    return rank, []


def big_round_trip(seed: int) -> bool:
    dist.init_process_group()
    data = torch.from_numpy(np.random.default_rng(seed).standard_normal(16 << 20).astype(np.float32))
    if dist.get_rank() == 0:
        dist.send(data, 1)
        back = torch.empty_like(data)
        dist.recv(back, 1)
        return bool(torch.equal(back, data)) and back.numpy().tobytes() == data.numpy().tobytes()
    middle = torch.empty(16 << 20, dtype=torch.float32)
    dist.recv(middle, 0)
    dist.send(middle, 0)
    return True


def init_twice_in_one_process() -> list[float]:
    values = []
    for round_ in range(2):
        dist.init_process_group()
        t = torch.tensor([float(round_)])
        if dist.get_rank() == 0:
            dist.send(t + 10, 1)
        else:
            dist.recv(t, 0)
        values.append(float(t[0]))
        dist.destroy_process_group()
        assert not dist.is_initialized()
    return values


def claim_rank_zero() -> None:
    dist.init_process_group(rank=0, timeout=30)


def disagree_on_world_size() -> None:
    size = 2 if os.environ["RANK"] == "0" else 3
    dist.init_process_group(world_size=size, timeout=30)


def recv_into_wrong_dtype() -> str:
    dist.init_process_group()
    if dist.get_rank() == 0:
        dist.send(torch.zeros(4, dtype=torch.float32), 1)
        dist.barrier()
        return ""
    try:
        dist.recv(torch.zeros(4, dtype=torch.int64), 0)
    except BufferMismatchError as exc:
        return str(exc)
    finally:
        dist.barrier()
    return "no error"


def wait_for_a_rank_that_leaves() -> str:
    dist.init_process_group()
    if dist.get_rank() == 0:
        dist.destroy_process_group()
        return "left"
    try:
        dist.recv(torch.zeros(1), 0)
    except PeerLostError as exc:
        return f"{exc.rank}: {exc}"
    return "no error"


# -- tests -----------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 4])
def test_blocking_send_recv_ring(n: int) -> None:
    results = spawn(n, ring_of_tensors)
    for rank, got in enumerate(results):
        assert got == [float((rank - 1) % n)] * 5


@pytest.mark.parametrize("n", [2, 4])
def test_isend_irecv_from_any_source(n: int) -> None:
    results = spawn(n, nonblocking_fan_in)
    assert results[0] == (0, [(r, r) for r in range(1, n)])


def test_64_mib_float32_round_trip_between_processes_is_bit_exact() -> None:
    assert spawn(2, big_round_trip, 7) == [True, True]


def test_destroy_then_init_again_in_the_same_process() -> None:
    assert spawn(2, init_twice_in_one_process) == [[0.0, 1.0], [10.0, 11.0]]


def test_duplicate_rank_is_reported_by_name() -> None:
    with pytest.raises(RendezvousError, match=r"rank 0 is claimed by two processes \(pid \d+ on .+ and pid \d+ on "):
        spawn(2, claim_rank_zero, timeout=60)


def test_world_size_mismatch_is_reported() -> None:
    with pytest.raises(RendezvousError, match="world size mismatch"):
        spawn(2, disagree_on_world_size, timeout=60)


def test_receive_buffer_mismatch_across_processes() -> None:
    _, message = spawn(2, recv_into_wrong_dtype)
    assert "rank 0 sent float32[4]" in message and "int64[4]" in message


def test_a_rank_that_leaves_fails_the_receive_waiting_on_it() -> None:
    results = spawn(2, wait_for_a_rank_that_leaves)
    assert results[0] == "left"
    assert results[1].startswith("0: rank 0 closed its process group")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ranks(script: Path, n: int, extra_env: dict[str, str] | None = None) -> list[str]:
    """Start ``n`` independent processes (as from separate shells) and return their stdout."""
    port = str(_free_port())
    procs = []
    for rank in range(n):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, **(extra_env or {})}
        if extra_env is None:
            env.update(RANK=str(rank), WORLD_SIZE=str(n))
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err
        outputs.append(out)
    return outputs


def test_two_independent_processes_rendezvous_by_env() -> None:
    out0, out1 = _run_ranks(REPO / "examples" / "env_send_recv.py", 2)
    expected0 = [float(10 * i + 1) for i in range(8)]
    assert out0.strip() == f"rank 0: {expected0}"
    assert out1.strip() == f"rank 1: {[float(10 * i) for i in range(8)]}"


@pytest.mark.parametrize("script", ["tutorial_p2p_blocking.py", "tutorial_p2p_nonblocking.py"])
def test_tutorial_point_to_point_examples(script: str) -> None:
    (out,) = _run_ranks(REPO / "examples" / script, 1, extra_env={})
    # The two ranks print concurrently, word by word, so their words interleave:
    # count what each rank's last word must be.
    assert out.count("tensor(1.)") == 2 and "tensor(0." not in out


def test_help_shows_real_docstrings() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import asyncdist as dist; help(dist.send)"],
        capture_output=True, text=True, check=True, env={**os.environ, "PAGER": "cat"},
    ).stdout
    assert "Send ``tensor`` to ``dst``" in out and "Raises:" in out and "PeerLostError" in out


BROADCASTS = 3000


def broadcasts_then_leave() -> list[float]:
    """Rank 0 broadcasts and leaves at once; the others receive every broadcast
    after it has gone (a root needs nobody to finish its part)."""
    dist.init_process_group()
    x = np.zeros(1)
    got = []
    work = np.random.default_rng(0).random((40, 40))
    for i in range(BROADCASTS):
        if dist.get_rank() == 0:
            x[0] = i
        else:
            np.linalg.svd(work)  # the receivers fall behind the root
        dist.broadcast(x, src=0)
        got.append(float(x[0]))
    dist.destroy_process_group()
    return got


def test_a_root_that_leaves_first_leaves_its_broadcasts_behind() -> None:
    # Each call's receivers announce it to the root; a root that closed its
    # sockets with such announcements unread would reset the connections and
    # destroy the broadcasts not yet read. Seen under load before the engine's
    # lingering close (1 run in 2: "rank 0 closed the connection"); on a quiet
    # machine the reset rarely happens, so this guards more than it reproduces.
    expected = [float(i) for i in range(BROADCASTS)]
    assert spawn(2, broadcasts_then_leave, timeout=90) == [expected, expected]


CYCLES_ON_ONE_PORT = 200
_CYCLES_SCRIPT = f"""
import time
from datetime import timedelta
import numpy as np
import asyncdist as dist

for cycle in range({CYCLES_ON_ONE_PORT}):
    dist.init_process_group(timeout=timedelta(seconds=30))
    x = np.ones(1)
    dist.all_reduce(x)
    assert x[0] == dist.get_world_size(), (cycle, x)
    if dist.get_rank() == 0:
        time.sleep(0.005)  # rank 0 has more to do (log, save): rank 1 is back first
    dist.destroy_process_group()
print("cycles", {CYCLES_ON_ONE_PORT})
"""


@pytest.mark.timeout(240)
def test_destroy_then_init_on_the_same_master_port_many_times(tmp_path: Path) -> None:
    # Rank 1 is often back in init_process_group while rank 0 still serves the
    # last cycle's store on the port: it must wait for the new one, not fail.
    script = tmp_path / "cycles.py"
    script.write_text(_CYCLES_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASYNCDIST_", "TORCHELASTIC_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "RANK": str(rank),
                                   "WORLD_SIZE": "2"})
             for rank in range(2)]
    for rank, proc in enumerate(procs):
        out, err = proc.communicate(timeout=220)
        assert (proc.returncode, out.strip()) == (0, f"cycles {CYCLES_ON_ONE_PORT}"), f"rank {rank}: {err[-3000:]}"

"""Environment detection with ranks started by launchers: a real Open MPI ``mpirun``
(skipped where it is not installed), and SLURM's documented ``srun`` variables.

Three ranks call ``init_process_group()`` with no rank or size: each must take
its place from the launcher's variables, join the store this test serves
(``ASYNCDIST_STORE_ADDR``, a port the kernel picked) and all_reduce to NumPy's
sum. Install Open MPI with ``apt-get install openmpi-bin`` (Debian, Ubuntu).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from asyncdist.rendezvous.tcp_store import TCPStore

MPIRUN = shutil.which("mpirun")

N = 3
SCRIPT = Path(__file__).with_name("launched_rank.py")
# Launchers' variables that would win over Open MPI's (see asyncdist.rendezvous.environments).
_OTHERS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PMI_RANK",
           "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "ASYNCDIST_STORE_ADDR", "TORCHELASTIC_RESTART_COUNT")


def _reports(stdout: str) -> list[dict]:
    """The ranks' JSON reports, by rank (mpirun may forward two ranks' lines run together)."""
    decoder, found, at = json.JSONDecoder(), [], stdout.find("{")
    while at >= 0:
        report, end = decoder.raw_decode(stdout, at)
        found.append(report)
        at = stdout.find("{", end)
    return sorted(found, key=lambda r: r["rank"])


def _check(reports: list[dict], source: str, local: list[tuple[int, int]]) -> None:
    """Every rank's report: its place from ``source`` and NumPy's sum of the inputs."""
    expected = sum(np.arange(4.0) + r for r in range(N)).tolist()
    assert [r["rank"] for r in reports] == list(range(N)), reports
    for rank, report in enumerate(reports):
        assert report == {"source": source, "rank": rank, "size": N, "local_rank": local[rank][0],
                          "local_size": local[rank][1], "sum": expected}


def _serve(secret: str) -> TCPStore:
    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=60, secret=secret)


def _environment(store: TCPStore, secret: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _OTHERS}
    env.update(ASYNCDIST_STORE_ADDR=f"127.0.0.1:{store.port}", ASYNCDIST_SECRET=secret)
    return env


def test_ranks_given_srun_variables_find_their_place_and_all_reduce() -> None:
    """Two "nodes" of 2 and 1 tasks, as srun describes them (SLURM_TASKS_PER_NODE="2,1")."""
    secret = secrets.token_hex(16)
    store = _serve(secret)
    nodes = [0, 0, 1]
    try:
        ranks = [subprocess.Popen([sys.executable, str(SCRIPT)], stdout=subprocess.PIPE, text=True, env={
            **_environment(store, secret), "SLURM_PROCID": str(rank), "SLURM_NTASKS": str(N),
            "SLURM_LOCALID": str(nodes[:rank].count(nodes[rank])), "SLURM_NODEID": str(nodes[rank]),
            "SLURM_TASKS_PER_NODE": "2,1", "SLURM_NNODES": "2"}) for rank in range(N)]
        outputs = [rank.communicate(timeout=100)[0] for rank in ranks]
    finally:
        store.close()
    assert [rank.returncode for rank in ranks] == [0] * N, outputs
    _check(_reports("".join(outputs)), "SLURM", [(0, 2), (1, 2), (0, 1)])


def _is_open_mpi() -> bool:
    done = subprocess.run([MPIRUN or "mpirun", "--version"], capture_output=True, text=True, timeout=30)
    return "Open MPI" in done.stdout + done.stderr or "OpenRTE" in done.stdout + done.stderr


@pytest.mark.skipif(MPIRUN is None, reason="needs Open MPI's mpirun (apt-get install openmpi-bin)")
def test_ranks_started_by_mpirun_find_their_place_and_all_reduce() -> None:
    if not _is_open_mpi():
        pytest.skip("mpirun is not Open MPI's")
    secret = secrets.token_hex(16)
    store = _serve(secret)
    try:
        env = _environment(store, secret)
        as_root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        exported = [arg for name in ("ASYNCDIST_STORE_ADDR", "ASYNCDIST_SECRET", "PYTHONPATH") if name in env
                    for arg in ("-x", name)]
        done = subprocess.run([MPIRUN or "mpirun", *as_root, "--oversubscribe", "-np", str(N), *exported,
                               sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=100)
    finally:
        store.close()
    assert done.returncode == 0, done.stdout + done.stderr
    _check(_reports(done.stdout), "Open MPI", [(rank, N) for rank in range(N)])  # one host

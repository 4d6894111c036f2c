"""torch's own torchrun starting asyncdist scripts, and asyncdist-run starting torch's.

torchrun's agent serves a torch TCPStore; an asyncdist facade script joins it
with torch's client (``asyncdist.rendezvous.torch_store``), and a torch
script with backend="asyncdist" builds its groups over it. The other way
round, asyncdist-run serves torch's TCPStore at MASTER_ADDR:MASTER_PORT (for
torch's env:// client) beside asyncdist's own store (ASYNCDIST_STORE_ADDR),
so unmodified torch scripts, gloo or asyncdist backend, run under it too,
restarts and several nodes included (see ``docs/torch.md``).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
ASYNCDIST_RUN = [sys.executable, "-m", "asyncdist.run", "--standalone", "--nproc-per-node", "2"]
TIMEOUT = 120  # seconds a run may take (about 6 s here; starting torch dominates)

# Set by a launcher this test may itself run under; the launchers under test set their own.
_LAUNCHER_VARS = re.compile(r"^(RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|MASTER_ADDR|MASTER_PORT|"
                            r"TORCHELASTIC_.*|ASYNCDIST_(SECRET|JOB_ID|AGENT_STORE|STORE_ADDR))$")

GLOO_SCRIPT = '''\
from datetime import timedelta
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
tensor = torch.ones(3) * (dist.get_rank() + 1)
dist.all_reduce(tensor)
print(f"rank {dist.get_rank()}: {tensor.tolist()}\\n", end="", flush=True)
dist.destroy_process_group()
'''


# Rank 1 fails in the first attempt, after the group was made; the second attempt must
# rendezvous afresh on the launcher's store, which still holds the first attempt's keys.
RESTART_SCRIPT = '''\
import os, sys
from datetime import timedelta
import torch
import torch.distributed as dist

backend = sys.argv[1]
if backend == "asyncdist":
    import asyncdist.torch_backend
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group(backend, timeout=timedelta(seconds=30))
tensor = torch.ones(2) * (dist.get_rank() + 1) * (attempt + 1)
dist.all_reduce(tensor)
print(f"attempt {attempt}: {tensor.tolist()}\\n", end="", flush=True)
dist.barrier()  # every rank has printed
if attempt == 0:
    if dist.get_rank() == 1:
        os._exit(3)
    dist.barrier()  # fails, or is stopped by the launcher: rank 1 is gone
dist.destroy_process_group()
print("finished\\n", end="", flush=True)
'''


def _clean_env() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if not _LAUNCHER_VARS.match(name)}


def _run(launcher: list[str], script: Path, cwd: Path, *args: str) -> str:
    result = subprocess.run([*launcher, str(script), *args], cwd=cwd, env=_clean_env(), capture_output=True,
                            text=True, timeout=TIMEOUT)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _by_rank(out: str) -> dict[int, list[str]]:
    """asyncdist-run's output lines, by the rank in their prefix."""
    lines: dict[int, list[str]] = {}
    for rank, text in re.findall(r"^\[rank (\d+)\]: (.*)$", out, re.M):
        lines.setdefault(int(rank), []).append(text)
    return lines


def _same_params_and_lower_loss(out: str, final: str, per_step: str) -> None:
    """Both ranks report the same parameters, and each one's loss went down."""
    finals = {int(rank): digest for rank, digest in re.findall(final, out, re.M)}
    assert sorted(finals) == [0, 1] and len(set(finals.values())) == 1, out
    for rank in (0, 1):
        losses = [float(x) for x in re.findall(per_step.format(rank=rank), out, re.M)]
        assert len(losses) >= 4 and losses[-1] < losses[0], (rank, losses)


def test_the_asyncdist_tutorial_under_the_real_torchrun(tmp_path: Path) -> None:
    out = _run(TORCHRUN, EXAMPLES / "tutorial_sgd.py", tmp_path)  # import asyncdist as dist
    _same_params_and_lower_loss(out, r"^Rank (\d) final loss [\d.]+ params sha256 ([0-9a-f]{64})$",
                                r"^Rank {rank}, epoch \d: ([\d.]+)$")


def _check_example(script: str, out: str) -> None:
    if script == "torch_ddp.py":
        _same_params_and_lower_loss(out, r"^rank (\d) done: loss .* params sha256 ([0-9a-f]{64})$",
                                    r"^rank {rank} step \d+ loss ([\d.]+)$")
    else:
        _same_params_and_lower_loss(out, r"^Rank (\d) final loss [\d.]+ params sha256 ([0-9a-f]{64})$",
                                    r"^Rank {rank}, epoch \d: ([\d.]+)$")


@pytest.mark.parametrize("script", ["torch_sgd_asyncdist_backend.py", "torch_ddp.py"])
def test_the_torch_examples_under_the_real_torchrun(tmp_path: Path, script: str) -> None:
    _check_example(script, _run(TORCHRUN, EXAMPLES / script, tmp_path))


def test_an_unmodified_gloo_script_under_asyncdist_run(tmp_path: Path) -> None:
    script = tmp_path / "gloo_all_reduce.py"
    script.write_text(GLOO_SCRIPT)
    out = _run(ASYNCDIST_RUN, script, tmp_path)
    assert _by_rank(out) == {0: ["rank 0: [3.0, 3.0, 3.0]"], 1: ["rank 1: [3.0, 3.0, 3.0]"]}, out


@pytest.mark.parametrize("script", ["torch_sgd_asyncdist_backend.py", "torch_ddp.py"])
def test_the_torch_examples_under_asyncdist_run(tmp_path: Path, script: str) -> None:
    out = _run(ASYNCDIST_RUN, EXAMPLES / script, tmp_path)
    _check_example(script, "\n".join(line for lines in _by_rank(out).values() for line in lines))


@pytest.mark.parametrize("backend", ["gloo", "asyncdist"])
def test_a_torch_script_restarted_by_asyncdist_run(tmp_path: Path, backend: str) -> None:
    """The store outlives the failed attempt (as torchrun's does); the next attempt still meets."""
    script = tmp_path / "restart.py"
    script.write_text(RESTART_SCRIPT)
    out = _run([*ASYNCDIST_RUN, "--max-restarts", "1"], script, tmp_path, backend)
    lines = _by_rank(out)
    assert lines[1] == ["attempt 0: [3.0, 3.0]", "attempt 1: [6.0, 6.0]", "finished"], out
    assert lines[0][0] == "attempt 0: [3.0, 3.0]" and lines[0][-2:] == ["attempt 1: [6.0, 6.0]", "finished"], out


def test_a_gloo_script_on_two_nodes_under_asyncdist_run(tmp_path: Path) -> None:
    """Two launchers, one worker each: node 1 finds node 0's stores through --master-port."""
    script = tmp_path / "gloo_all_reduce.py"
    script.write_text(GLOO_SCRIPT)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**_clean_env(), "ASYNCDIST_SECRET": "the-same-on-every-node"}
    nodes = [
        subprocess.Popen([sys.executable, "-m", "asyncdist.run", "--nnodes", "2", "--node-rank", str(node),
                          "--master-port", str(port), "--nproc-per-node", "1", "--rdzv-id", "torch-job", str(script)],
                         cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for node in (1, 0)  # node 1 first: its launcher waits for node 0's stores
    ]
    try:
        outputs = [node.communicate(timeout=TIMEOUT) for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    assert [node.returncode for node in nodes] == [0, 0], outputs
    assert _by_rank(outputs[1][0]) == {0: ["rank 0: [3.0, 3.0, 3.0]"]}, outputs
    assert _by_rank(outputs[0][0]) == {1: ["rank 1: [3.0, 3.0, 3.0]"]}, outputs

"""The training examples run as their docstrings say, and reach what they claim.

``tutorial_sgd.py`` runs under the launcher with 4 ranks and must end with the
same parameters on every rank and a lower loss. The await examples run in one
event loop (``python examples/x.py``) and as 3 launched processes, and must
print the results that their own checks passed. The launcher runs with
``--standalone`` (a free port instead of 29500), so that test runs never meet.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RUN = [sys.executable, "-m", "asyncdist.run", "--standalone"]
TIMEOUT = 120  # seconds a run may take (a few, usually; torch imports dominate)


def _run(args: list[str], cwd: Path) -> str:
    """Run to the end and return stdout; without RANK, so that examples start their own ranks."""
    env = {name: value for name, value in os.environ.items() if name != "RANK"}
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _launch(nproc: int, script: str, cwd: Path) -> str:
    """The workers' lines of ``asyncdist-run``, each prefix checked and removed."""
    out = _run([*RUN, "--nproc-per-node", str(nproc), str(EXAMPLES / script)], cwd)
    lines = out.splitlines()
    assert all(re.match(r"\[rank \d+\]: ", line) for line in lines), out
    return "\n".join(line.split(": ", 1)[1] for line in lines)


def test_tutorial_sgd_under_the_launcher_trains_the_same_parameters_on_every_rank(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = _launch(4, "tutorial_sgd.py", tmp_path)
    finals = {int(r): (float(loss), digest) for r, loss, digest in
              re.findall(r"^Rank (\d) final loss ([\d.]+) params sha256 ([0-9a-f]{64})$", out, re.M)}
    assert sorted(finals) == [0, 1, 2, 3]
    assert len({digest for _, digest in finals.values()}) == 1, finals
    for rank, (final_loss, _) in finals.items():
        losses = [float(x) for x in re.findall(rf"^Rank {rank}, epoch \d: ([\d.]+)$", out, re.M)]
        assert len(losses) == 5 and losses[-1] == final_loss
        assert losses == sorted(losses, reverse=True) and losses[-1] < 0.7 * losses[0], losses


def _check_parameter_server(out: str, size: int) -> None:
    (server,) = re.findall(r"^server: (\d+) updates, from (.*)$", out, re.M)
    updates = int(server[0])
    by_worker = dict(re.findall(r"worker (\d+): (\d+)", server[1]))
    assert sorted(int(r) for r in by_worker) == list(range(1, size))
    assert sum(map(int, by_worker.values())) == updates >= 300
    assert min(map(int, by_worker.values())) >= 1  # each worker is served, whatever its speed
    ranks = re.findall(r"^rank (\d+): (\d+) updates == (\d+) gradients sent, distance to the target (\S+)$", out, re.M)
    assert sorted(int(r) for r, *_ in ranks) == list(range(size))
    for _, applied, sent, distance in ranks:
        assert int(applied) == int(sent) == updates and float(distance) <= 1e-6


def _check_gossip(out: str, size: int) -> None:
    ranks = re.findall(r"^rank (\d+): every rank within (\S+) of the global mean after 100 rounds$", out, re.M)
    assert sorted(int(r) for r, _ in ranks) == list(range(size))
    assert all(float(spread) <= 1e-9 for _, spread in ranks), ranks


CHECKS = {"parameter_server.py": _check_parameter_server, "gossip_averaging.py": _check_gossip}


@pytest.mark.parametrize(("script", "size"), [("parameter_server.py", 4), ("gossip_averaging.py", 5)])
def test_await_example_in_one_loop(tmp_path: Path, script: str, size: int) -> None:
    CHECKS[script](_run([sys.executable, str(EXAMPLES / script)], tmp_path), size)


@pytest.mark.parametrize("script", ["parameter_server.py", "gossip_averaging.py"])
def test_await_example_as_three_launched_processes(tmp_path: Path, script: str) -> None:
    CHECKS[script](_launch(3, script, tmp_path), 3)

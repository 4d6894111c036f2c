"""``examples/elastic_sgd.py`` under the launcher, with every rank killed in turn:
a rank is SIGKILLed at a fixed step, the survivors shrink and go on, and a
replacement joins at the grow step if the kill came before it; if it came
after, the replacement is never admitted, is told so when the survivors
have exited, and the run still ends at once. Either way the final parameters
equal plain SGD on one process with the same schedule, computed here (the
model and data come from the example; the schedule, full batches of 128
one step after another, is this file's).

Two ranks keep the matrix fast (each process imports torch, about 3 s of
CPU): every rank, 0 included, is killed before and after the grow step.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RUN = [sys.executable, "-m", "asyncdist.run", "--standalone"]
TIMEOUT = 90  # seconds one run may take (about 7, mostly torch's imports)
NPROC, STEPS, GROW_STEP = 2, 8, 4
KILL_BEFORE_GROW, KILL_AFTER_GROW = 2, 6


def sequential_reference(steps: int) -> list[np.ndarray]:
    """SGD on one process: step s on the whole of batch s, mean loss, learning rate 0.2."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    sys.path.insert(0, str(EXAMPLES))
    try:
        from elastic_sgd import Net, batch, dataset
    finally:
        sys.path.remove(str(EXAMPLES))
    torch.manual_seed(1234)
    model = Net()
    features, labels = dataset()
    for step in range(steps):
        rows = batch(step)
        model.zero_grad()
        F.nll_loss(model(features[rows]), labels[rows]).backward()
        with torch.no_grad():
            for param in model.parameters():
                param -= 0.2 * param.grad
    return [p.detach().numpy().copy() for p in model.parameters()]


@pytest.fixture(scope="module")
def reference() -> list[np.ndarray]:
    return sequential_reference(STEPS)


@pytest.mark.timeout(TIMEOUT + 30)
@pytest.mark.parametrize("kill_step", [KILL_BEFORE_GROW, KILL_AFTER_GROW], ids=["before-grow", "after-grow"])
@pytest.mark.parametrize("kill_rank", range(NPROC))
def test_elastic_sgd_finishes_right_whichever_rank_dies_whenever(
    tmp_path: Path, kill_rank: int, kill_step: int, reference: list[np.ndarray]
) -> None:
    out = tmp_path / "final.npz"
    env = {name: value for name, value in os.environ.items() if name != "RANK"}
    env["ASYNCDIST_AGENT_STORE"] = "asyncdist"  # the workers use asyncdist's store alone: the launcher skips torch
    result = subprocess.run(
        [*RUN, "--nproc-per-node", str(NPROC), "--on-failure", "continue", "--replace", "1",
         str(EXAMPLES / "elastic_sgd.py"), "--steps", str(STEPS), "--kill-rank", str(kill_rank),
         "--kill-step", str(kill_step), "--grow-step", str(GROW_STEP), "--out", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    survivors = [str(r) for r in range(NPROC) if r != kill_rank]
    replaced = kill_step < GROW_STEP
    finished = ", ".join([f"rank {r}" for r in survivors] + (["replacement 1"] if replaced else []))
    summary = f"asyncdist-run: finished: {finished}; died: rank {kill_rank} (SIGKILL)"
    if not replaced:
        summary += "; never admitted (the job ended before a grow): replacement 1"
    assert result.stderr.rstrip().endswith(summary), result.stderr

    failed = re.findall(r"^\[rank (\d)\]: rank \d: step (\d+) failed \(.*\); shrinking$", result.stdout, re.M)
    assert sorted(r for r, _ in failed) == survivors, result.stdout
    assert all(int(step) in (kill_step - 1, kill_step) for _, step in failed), failed
    finals = re.findall(r"^\[rank (\+1|\d)\]: rank (\d) of (\d): (\d+) steps, params sha256 ([0-9a-f]{64})$",
                        result.stdout, re.M)
    size = NPROC if replaced else NPROC - 1
    assert sorted(who for who, *_ in finals) == sorted(survivors + (["+1"] if replaced else [])), result.stdout
    assert sorted(int(rank) for _, rank, *_ in finals) == list(range(size))
    assert {(of, steps, digest) for _, _, of, steps, digest in finals} == {(str(size), str(STEPS), finals[0][4])}

    with np.load(out) as saved:
        got = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    assert [g.shape for g in got] == [w.shape for w in reference]
    for g, w in zip(got, reference):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)

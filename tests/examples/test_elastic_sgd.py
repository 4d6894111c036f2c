"""``examples/elastic_sgd.py`` under the launcher: a rank is SIGKILLed at a fixed
step, the survivors shrink and go on, a replacement joins at a later step; the
final parameters equal plain SGD on one process with the same schedule,
computed here (the model and data come from the example; the schedule, full
batches of 128 one step after another, is this file's).
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
TIMEOUT = 120  # seconds the run may take (about 10, mostly torch's imports)
STEPS, KILL_STEP, GROW_STEP = 12, 4, 7


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


def test_elastic_sgd_survives_a_killed_rank_and_takes_in_a_replacement(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "final.npz"
    env = {name: value for name, value in os.environ.items() if name != "RANK"}
    env["ASYNCDIST_AGENT_STORE"] = "asyncdist"  # the workers use asyncdist's store alone: the launcher skips torch
    result = subprocess.run(
        [*RUN, "--nproc-per-node", "4", "--on-failure", "continue", "--replace", "1", str(EXAMPLES / "elastic_sgd.py"),
         "--steps", str(STEPS), "--kill-rank", "3", "--kill-step", str(KILL_STEP), "--grow-step", str(GROW_STEP),
         "--out", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "asyncdist-run: finished: rank 0, rank 1, rank 2, replacement 1; died: rank 3 (SIGKILL)" in result.stderr

    failed = re.findall(r"^\[rank ([012])\]: rank \d: step (\d+) failed \(.*\); shrinking$", result.stdout, re.M)
    assert sorted(r for r, _ in failed) == ["0", "1", "2"], result.stdout
    assert all(int(step) in (KILL_STEP - 1, KILL_STEP) for _, step in failed), failed
    finals = re.findall(r"^\[rank (\+1|[012])\]: rank (\d) of 4: (\d+) steps, params sha256 ([0-9a-f]{64})$",
                        result.stdout, re.M)
    assert sorted(who for who, *_ in finals) == ["+1", "0", "1", "2"], result.stdout
    assert sorted(int(rank) for _, rank, _, _ in finals) == [0, 1, 2, 3]
    assert {(steps, digest) for _, _, steps, digest in finals} == {(str(STEPS), finals[0][3])}

    with np.load(out) as saved:
        got = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    want = sequential_reference(STEPS)
    assert [g.shape for g in got] == [w.shape for w in want]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)

"""examples/ray_parameter_server.py runs as written (its own local Ray cluster)
and reaches what it claims: every gradient applied once, the target reached."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ray_parameter_server.py"


def test_the_ray_parameter_server_example_runs_and_converges(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(EXAMPLE)], cwd=tmp_path, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stdout + done.stderr
    found = re.search(r"^server applied (\d+) gradients from workers (\{.*\}); distance to the target (\S+)$",
                      done.stdout, re.M)
    assert found, done.stdout
    pushes = ast.literal_eval(found[2])
    assert sorted(pushes) == [1, 2, 3] and min(pushes.values()) >= 1
    assert sum(pushes.values()) == int(found[1]) >= 240
    assert float(found[3]) < 1e-6

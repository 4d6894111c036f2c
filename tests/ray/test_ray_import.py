"""Nothing of Ray is imported unless asyncdist.ray is (runs with or without Ray installed)."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECK = """
import sys
import asyncdist, asyncdist.run, asyncdist.testing, asyncdist.launcher, asyncdist.torch_backend
assert not [m for m in sys.modules if m == "ray" or m.startswith("ray.")], "ray imported"
"""


def test_asyncdist_does_not_import_ray() -> None:
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_asyncdist_ray_imports_ray() -> None:
    pytest.importorskip("ray")
    done = subprocess.run([sys.executable, "-c", "import sys, asyncdist.ray; assert 'ray' in sys.modules"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr

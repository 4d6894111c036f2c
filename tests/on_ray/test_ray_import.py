"""Nothing of Ray is imported unless asyncdist.ray is (runs with or without Ray installed)."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys
import asyncdist, asyncdist.run, asyncdist.testing, asyncdist.launcher, asyncdist.bench.cli
assert not [m for m in sys.modules if m == "ray" or m.startswith("ray.")], "ray imported"
"""


def test_asyncdist_does_not_import_ray() -> None:
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


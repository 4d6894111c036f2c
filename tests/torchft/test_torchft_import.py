"""Nothing of torchft is imported unless asyncdist.torchft is (runs with or without torchft installed)."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys
import asyncdist, asyncdist.run, asyncdist.testing, asyncdist.launcher, asyncdist.bench.cli
import asyncdist.torch_backend
assert not [m for m in sys.modules if m == "torchft" or m.startswith(("torchft.", "asyncdist.torchft"))], "torchft imported"
"""


def test_asyncdist_does_not_import_torchft() -> None:
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr

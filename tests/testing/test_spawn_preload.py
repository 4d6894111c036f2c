"""``spawn``'s forkserver preloads torch only for a process that has imported it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from asyncdist.testing import spawn

pytest.importorskip("torch")

SCRIPT = """\
import sys
from asyncdist.testing import spawn

def torch_loaded():
    return "torch" in sys.modules

if __name__ == "__main__":
    print(spawn(2, torch_loaded), "torch" in sys.modules)
"""


def torch_loaded() -> bool:
    return "torch" in sys.modules


def test_ranks_of_a_process_that_imported_torch_have_it_already() -> None:
    assert "torch" in sys.modules  # imported above
    assert spawn(2, torch_loaded) == [True, True]


def test_ranks_of_a_process_without_torch_do_not_import_it(tmp_path: Path) -> None:
    script = tmp_path / "numpy_only.py"
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90, check=True).stdout
    assert out.split() == ["[False,", "False]", "False"], out

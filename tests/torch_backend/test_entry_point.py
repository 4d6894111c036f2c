"""The ``torch.backends`` entry point: ``torch.distributed.init_process_group("asyncdist")``
in a script that never imports asyncdist, and an ``import torch`` that loads
none of asyncdist's runtime.

The entry point is declared in pyproject.toml, so it exists once asyncdist is
installed (CI: ``pip install -e .``). These tests do not rely on the
installation being current: each subprocess gets a directory holding a
one-entry-point distribution (``*.dist-info`` with ``entry_points.txt``) on
its ``PYTHONPATH``, which ``importlib.metadata`` finds as it finds any
installed one. Where the installed asyncdist declares the entry point too,
torch calls it twice, which registration tolerates.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]

ENTRY_POINTS = "[torch.backends]\nasyncdist = asyncdist_torch_hook:register\n"

# A torch script: no asyncdist anywhere.
RANK = """
import sys
import torch
import torch.distributed as dist

loaded = sorted(m for m in sys.modules if m.split(".")[0] == "asyncdist")
rank, port = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("asyncdist", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
t = torch.full((3,), float(rank + 1))
dist.all_reduce(t)
print(loaded, dist.get_backend(), t.tolist(), "asyncdist.torch_backend" in sys.modules)
dist.destroy_process_group()
"""


@pytest.fixture
def plugin_path(tmp_path: Path) -> str:
    info = tmp_path / "asyncdist_entry_point_test-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: asyncdist-entry-point-test\nVersion: 0\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    return os.pathsep.join([str(tmp_path), str(REPO)])


def _env(pythonpath: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    env["PYTHONPATH"] = pythonpath
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_import_torch_registers_the_name_without_asyncdist(plugin_path: str) -> None:
    code = (
        "import sys, torch\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'asyncdist'))\n"
        "print('asyncdist' in torch.distributed.Backend.backend_list, 'ASYNCDIST' in torch.distributed.Backend._plugins)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=_env(plugin_path), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["[]", "True True"]


def test_init_process_group_asyncdist_with_no_asyncdist_import(plugin_path: str) -> None:
    port = str(_free_port())
    ranks = [
        subprocess.Popen([sys.executable, "-c", RANK, str(r), port], env=_env(plugin_path), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for r in range(2)
    ]
    outputs = []
    try:
        for proc in ranks:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
            outputs.append(out.strip())
    finally:
        for proc in ranks:
            if proc.poll() is None:
                proc.kill()
    assert outputs == ["[] asyncdist [3.0, 3.0, 3.0] True"] * 2


def test_the_asyncdist_errors_imported_first_become_torchs(plugin_path: str) -> None:
    code = (
        "import asyncdist.errors as errors, sys\n"
        "assert 'torch' not in sys.modules\n"
        "import torch\n"  # the entry point runs here
        "print(issubclass(errors.PeerLostError, torch.distributed.DistNetworkError))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=_env(plugin_path), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"


def test_the_hook_registers_the_backend_under_its_own_name_and_devices() -> None:
    # The hook keeps copies (importing the backend would import asyncdist's runtime).
    import asyncdist_torch_hook
    from asyncdist.torch_backend import process_group

    assert asyncdist_torch_hook.BACKEND_NAME == process_group.BACKEND_NAME == "asyncdist"
    assert asyncdist_torch_hook.DEVICES == process_group.DEVICES == ["cpu", "cuda"]

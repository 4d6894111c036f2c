"""Tests for asyncdist.errors: torch's Dist*Error classes are bases of asyncdist's
once torch is imported, whichever of the two is imported first, and never
before (``import asyncdist`` imports no torch)."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from asyncdist import errors

REPO = Path(__file__).resolve().parents[1]

# What code written for torch.distributed catches, for each asyncdist error.
TORCH_BASES = {
    "PeerLostError": "DistNetworkError",
    "ProtocolError": "DistNetworkError",
    "StoreError": "DistStoreError",
    "StoreTimeoutError": "DistStoreError",
    "OperationTimeoutError": "DistBackendError",
    "CollectiveMismatchError": "DistBackendError",
    "ClosedError": "DistBackendError",
    "InvalidArgumentError": "DistError",
    "RendezvousError": "DistError",
}


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_hierarchy_without_torch() -> None:
    """The torch-named classes are asyncdist's own, and the builtin bases stay."""
    assert issubclass(errors.PeerLostError, errors.DistNetworkError)
    assert issubclass(errors.StoreTimeoutError, errors.DistStoreError) and issubclass(errors.StoreTimeoutError, TimeoutError)
    assert issubclass(errors.InvalidRankError, ValueError) and issubclass(errors.AsyncDistError, errors.DistError)
    assert issubclass(errors.QueueEmptyError, errors.DistStoreError)


def test_torch_code_catches_a_lost_peer() -> None:
    torch = pytest.importorskip("torch")
    from asyncdist._torch import torch_or_none

    torch_or_none()  # adopts, if nothing did before
    with pytest.raises(torch.distributed.DistNetworkError) as info:
        raise errors.PeerLostError("rank 0: lost rank 1", rank=1)
    assert pickle.loads(pickle.dumps(info.value)).rank == 1
    for ours, theirs in TORCH_BASES.items():
        assert issubclass(getattr(errors, ours), getattr(torch.distributed, theirs)), ours
    assert errors.adopt_torch_bases(torch)  # again: nothing changes
    assert errors.PeerLostError.__mro__.count(torch.distributed.DistError) == 1


@pytest.mark.parametrize("order", ["asyncdist first", "torch first"])
def test_either_import_order(order: str) -> None:
    """torch first: adopted at asyncdist's import. asyncdist first: by the
    entry point at torch's import (here switched off, so by torch_or_none)."""
    pytest.importorskip("torch")
    first = "import asyncdist, sys; assert 'torch' not in sys.modules; import torch" if order == "asyncdist first" else (
        "import torch, asyncdist")
    out = _run(
        f"{first}\n"
        "from asyncdist._torch import torch_or_none\n"
        "from asyncdist.errors import PeerLostError\n"
        "print(issubclass(PeerLostError, torch.distributed.DistNetworkError))\n"
        "torch_or_none()\n"
        "try:\n"
        "    raise PeerLostError('lost', rank=2)\n"
        "except torch.distributed.DistNetworkError as exc:\n"
        "    print('caught', exc.rank)\n"
    )
    assert out.split("\n")[:2] == ["True" if order == "torch first" else "False", "caught 2"]


def test_without_torch() -> None:
    out = _run(
        "import sys; sys.modules['torch'] = None  # `import torch` fails\n"
        "import asyncdist\n"
        "from asyncdist._torch import torch_or_none\n"
        "assert torch_or_none() is None\n"
        "print(asyncdist.DistNetworkError.__mro__[1].__name__, issubclass(asyncdist.errors.PeerLostError, RuntimeError))\n"
    )
    assert out.strip() == "DistError True"

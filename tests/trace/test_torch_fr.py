"""torch's flight-recorder analyzer reads asyncdist's dumps: a real desync on
backend="asyncdist", dumped by the ranks themselves, exported with
``asyncdist-trace export --torch`` and read by ``python -m
torch.distributed.flight_recorder.fr_trace``, which names the call, the
culprit rank and what differs, after pairing the calls before it."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from asyncdist.testing import spawn
from asyncdist.trace.cli import main

torch = pytest.importorskip("torch")


def desync(store: Path) -> str:
    """Good calls of several kinds, then rank 0 all_reduces while rank 1
    broadcasts: collective call #5 of the world (#0 is init's barrier)."""
    import torch.distributed as tdist

    import asyncdist.torch_backend  # noqa: F401  (registers "asyncdist")

    rank = int(os.environ["RANK"])
    tdist.init_process_group("asyncdist", init_method=f"file://{store}", rank=rank, world_size=2,
                             timeout=timedelta(seconds=60))
    tdist.all_reduce(torch.ones(4))
    tdist.all_gather_into_tensor(torch.zeros(6), torch.ones(3))
    tdist.reduce_scatter_tensor(torch.zeros(2), torch.ones(4))
    tdist.broadcast(torch.ones(3), src=0)
    try:
        if rank == 0:
            tdist.all_reduce(torch.ones(8))
        else:
            tdist.broadcast(torch.ones(8), src=0)
    except RuntimeError as exc:
        return type(exc).__name__
    return "no error"


def test_torchs_analyzer_names_the_desync_in_an_exported_dump(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dumps, exported = tmp_path / "dumps", tmp_path / "torch"
    errors = spawn(2, desync, tmp_path / "store", env={"ASYNCDIST_TRACE_DIR": str(dumps)})
    assert errors == ["CollectiveMismatchError"] * 2

    assert main(["export", str(dumps), "--torch", str(exported)]) == 0
    assert "wrote 2 dumps" in capsys.readouterr().out
    rank0 = pickle.loads((exported / "torch-fr-rank0").read_bytes())
    calls = [(e["profiling_name"], e["process_group"], e["collective_seq_id"], e["input_sizes"], e["output_sizes"])
             for e in rank0["entries"]]
    assert [name for name, *_ in calls] == ["gloo:barrier", "gloo:all_reduce", "gloo:all_gather",
                                            "gloo:reduce_scatter", "gloo:broadcast", "gloo:all_reduce"]
    gathered, scattered = calls[2], calls[3]
    assert gathered == ("gloo:all_gather", ("torch:0", "default_pg"), 2, [[3]], [[6]])
    assert scattered == ("gloo:reduce_scatter", ("torch:0", "default_pg"), 3, [[4]], [[2]])
    assert calls[-1] == ("gloo:all_reduce", ("torch:0", "default_pg"), 5, [[8]], [[8]])

    analyzer = subprocess.run(
        [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(exported), "--prefix", "torch-fr-rank"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    )
    report = analyzer.stdout + analyzer.stderr
    assert analyzer.returncode == 0, report
    # The first call it cannot pair is the desync, and it says which rank and what.
    assert report.count("has errors") == 1, report
    assert "Collective sequence number: 5 has errors" in report, report
    assert "Culprit rank 1; Error type: COLLECTIVE_TYPE_MISMATCH, Expected collective type: 'all_reduce' " \
           "does not match found collective type: 'broadcast'" in report, report

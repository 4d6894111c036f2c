"""The CUDA all_reduce benchmark runs end to end (on CPU tensors here; on CUDA when there is one)."""

from __future__ import annotations

import json

import pytest

from asyncdist.bench import cuda_staging

pytest.importorskip("torch")


def _rows(tmp_path, device: str, paths: str) -> list[dict]:
    out = tmp_path / "rows.json"
    argv = ["--device", device, "--bytes", "64K", "--iters", "2", "--warmup", "1", "--paths", paths, "--json", str(out)]
    assert cuda_staging.main(argv) == 0
    return json.loads(out.read_text())


def test_smoke_on_cpu_tensors(tmp_path, capsys):
    rows = _rows(tmp_path, "cpu", "asyncdist,gloo,asyncdist-nccl")
    assert [r["path"] for r in rows] == ["asyncdist", "gloo"]  # each rank checked its sum
    assert all(r["median_ms"] > 0 and r["bytes"] == 64 * 1024 for r in rows)
    assert "skipped: NCCL needs CUDA" in capsys.readouterr().out


@pytest.mark.gpu
def test_on_cuda_tensors(tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    rows = _rows(tmp_path, "cuda", "asyncdist,gloo")
    assert [r["path"] for r in rows] == ["asyncdist", "gloo"]

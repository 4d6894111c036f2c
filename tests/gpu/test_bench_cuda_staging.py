"""The CUDA collectives benchmark runs end to end (on CPU tensors here; on CUDA when there is one)."""

from __future__ import annotations

import json

import pytest

from asyncdist.bench import cuda_staging

pytest.importorskip("torch")

OPS = "all_reduce,broadcast,all_gather,ddp"


def _rows(tmp_path, device: str, paths: str, ops: str = "all_reduce") -> list[dict]:
    out = tmp_path / "rows.json"
    argv = ["--device", device, "--bytes", "64K,128K", "--iters", "2", "--warmup", "1", "--paths", paths,
            "--ops", ops, "--json", str(out)]
    assert cuda_staging.main(argv) == 0
    return json.loads(out.read_text())


def test_smoke_on_cpu_tensors(tmp_path, capsys):
    rows = _rows(tmp_path, "cpu", "asyncdist,gloo,asyncdist-torch,asyncdist-nccl", OPS)
    # each rank checked every op once (sums, values, the weights after a DDP step) before timing it
    paths = ("asyncdist", "gloo", "asyncdist-torch")
    by_path = {path: [(r["op"], r["bytes"]) for r in rows if r["path"] == path] for path in paths}
    sizes = [64 * 1024, 128 * 1024]
    facade_ops = ("all_reduce", "broadcast", "all_gather")  # DDP is torch.distributed's
    assert by_path["asyncdist"] == [(op, b) for op in facade_ops for b in sizes]
    assert by_path["gloo"] == by_path["asyncdist-torch"] == [(op, b) for op in OPS.split(",") for b in sizes]
    assert all(r["median_ms"] > 0 for r in rows)
    for r in rows:  # nccl-tests' bus bandwidth: all_reduce 2(n-1)/n, all_gather (n-1)/n, broadcast 1 (n = 2)
        factor = {"all_reduce": 1.0, "all_gather": 0.5, "broadcast": 1.0, "ddp": 0.0}[r["op"]]
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * factor)
    assert "skipped: NCCL needs CUDA" in capsys.readouterr().out


@pytest.mark.gpu
def test_on_cuda_tensors(tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    rows = _rows(tmp_path, "cuda", "asyncdist,gloo", "all_reduce,broadcast")
    expected = [(p, op) for p in ("asyncdist", "gloo") for op in ("all_reduce", "broadcast") for _size in range(2)]
    assert [(r["path"], r["op"]) for r in rows] == expected

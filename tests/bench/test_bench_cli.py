"""Smoke tests of ``asyncdist-bench``: it runs, and its outputs have the promised shape.

Benchmarks are not tests: nothing here looks at how fast anything was.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from asyncdist.bench.cli import build_parser, main
from asyncdist.bench.loops import Sample
from asyncdist.bench.plan import SERIES, Job, Plan, parse_bytes, size_sweep
from asyncdist.bench.runner import combine

OPS = ["all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all", "barrier", "sendrecv"]
# Two sizes (8 B, 64 B), one warm-up call, two repetitions of two calls: seconds, not minutes.
TINY = ["--world-size", "2", "-b", "8", "-e", "64", "-f", "8", "--warmup", "1", "--reps", "2", "--iters", "2"]
ROW_FIELDS = {
    "op", "bytes", "count", "dtype", "library", "api", "world_size",
    "time_us", "algbw_gbps", "busbw_gbps", "iters", "reps_us",
}


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[str, str]:
    assert main(list(args), prog="asyncdist-bench") == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


def table_titles(out: str) -> list[str]:
    return [line.split(",")[0][2:] for line in out.splitlines() if line.startswith("# ") and ", 2 ranks:" in line]


# -- the command line ------------------------------------------------------------------


def test_help_names_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"], prog="asyncdist-bench")
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--world-size", "--ops", "--min-bytes", "--max-bytes", "--step-factor", "--dtype", "--api",
                 "--compare", "--reps", "--iters", "--quick", "--json", "--plot"):
        assert flag in out


def test_module_entry_point_runs() -> None:
    done = subprocess.run([sys.executable, "-m", "asyncdist.bench", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "python -m asyncdist.bench" in done.stdout


def test_bad_arguments_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["--ops", "all_reduce,nope"], ["-b", "lots"], ["-b", "1K", "-e", "8"]):
        with pytest.raises(SystemExit) as exit_info:
            main(args, prog="asyncdist-bench")
        assert exit_info.value.code == 2
    assert "nope" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "expected"), [("8", 8), ("1K", 1024), ("64M", 64 << 20), ("2KiB", 2048), ("1g", 1 << 30)])
def test_parse_bytes(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


def test_size_sweep_is_inclusive() -> None:
    assert size_sweep(8, 64 << 20, 4)[-1] == 32 << 20
    assert size_sweep(8, 128, 2) == [8, 16, 32, 64, 128]


def test_quick_preset_fills_only_flags_not_given() -> None:
    from asyncdist.bench.cli import _settings

    settings = _settings(build_parser().parse_args(["--quick", "--reps", "7"]))
    assert settings["reps"] == 7 and settings["max_bytes"] == 64 << 10


def test_max_over_ranks_then_median_over_repetitions() -> None:
    plan = Plan(world_size=2, dtype="float32", array="numpy", jobs=(Job("all_reduce", 256), Job("sendrecv", 256)), reps=3)
    rank0 = [Sample(4, (1e-3, 5e-3, 2e-3)), Sample(4, (4e-3, 4e-3, 4e-3))]
    rank1 = [Sample(4, (3e-3, 1e-3, 1e-3)), Sample(4, (2e-3, 2e-3, 2e-3))]
    reduce, pingpong = combine(SERIES["await"], plan, [rank0, rank1])
    assert reduce.reps_us == pytest.approx((3e3, 5e3, 2e3)) and reduce.time_us == pytest.approx(3e3)
    assert reduce.nbytes == 1024 and reduce.busbw == pytest.approx(reduce.algbw)  # 2(n-1)/n = 1 for n = 2
    assert pingpong.time_us == pytest.approx(2e3)  # one-way: half the round trip


# -- tiny sweeps on real rank processes --------------------------------------------------


def test_tiny_sweep_asyncdist_alone(capsys: pytest.CaptureFixture[str]) -> None:
    out, err = run(capsys, *TINY)
    assert out.startswith("# asyncdist-bench --world-size 2")
    assert "asyncdist" in out.splitlines()[1] and "loop" in out.splitlines()[1]
    assert table_titles(out) == OPS
    assert "gloo" not in out and "running asyncdist (await API)" in err


def test_tiny_sweep_compared_with_gloo(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    out, err = run(capsys, *TINY, "--compare", "gloo", "--ops", "all_reduce,all_gather,sendrecv")
    assert table_titles(out) == ["all_reduce", "all_gather", "sendrecv"]
    assert "> 1 means asyncdist is faster" in out
    assert "(gloo/asyncdist)" in out and "running torch.distributed gloo" in err


def test_json_has_one_row_per_op_size_and_library(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    out, _ = run(capsys, *TINY, "--compare", "gloo", "--json")
    report = json.loads(out)
    assert {"command", "environment", "config", "rows"} <= report.keys()
    rows = report["rows"]
    assert all(ROW_FIELDS <= row.keys() for row in rows)
    keys = [(row["op"], row["bytes"], row["library"]) for row in rows]
    assert len(keys) == len(set(keys))
    expected = {(op, size, lib) for op in OPS if op != "barrier" for size in (8, 64) for lib in ("asyncdist", "gloo")}
    expected |= {("barrier", 0, lib) for lib in ("asyncdist", "gloo")}
    assert set(keys) == expected
    assert all("gloo_ratio" in row for row in rows if row["library"] == "asyncdist")
    assert all(row["busbw_gbps"] is None for row in rows if row["op"] == "barrier")


def test_api_both_reports_the_facade_overhead(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    path = tmp_path / "bench.json"
    out, _ = run(capsys, *TINY, "--api", "both", "--ops", "all_reduce,barrier", "--json", str(path))
    assert "overhead" in out and "facade overhead per call" in out
    report = json.loads(path.read_text())
    assert set(report["facade_overhead_us"]) == {"all_reduce", "barrier"}
    assert {(row["library"], row["api"]) for row in report["rows"]} == {("asyncdist", "await"), ("asyncdist", "facade")}


def test_plot_is_skipped_with_a_message_without_matplotlib(capsys, monkeypatch, tmp_path) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    path = tmp_path / "bench.png"
    out, err = run(capsys, *TINY, "--ops", "barrier", "--plot", str(path))
    assert "matplotlib is not installed" in err and "barrier" in out
    assert not path.exists()


def test_plot_is_written_with_matplotlib(capsys, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "bench.png"
    run(capsys, *TINY, "--ops", "all_reduce,barrier", "--plot", str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

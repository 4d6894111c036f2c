"""Smoke tests of ``asyncdist-bench``: it runs, and its outputs have the promised shape.

Benchmarks are not tests: nothing here looks at how fast anything was.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from asyncdist.bench import floor, fsdp, mpi, report
from asyncdist.bench.cases import CASES, jobs
from asyncdist.bench.cli import _series, build_parser, main
from asyncdist.bench.ddp import LAYERS, STEP_OPS, mlp_params, mlp_width
from asyncdist.bench.loops import Sample
from asyncdist.bench.plan import SERIES, Job, Plan, parse_bytes, size_sweep
from asyncdist.bench.progress import Progress
from asyncdist.bench.runner import combine, runs

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
                 "--compare", "gloo,mpi", "--reps", "--iters", "--quick", "--json", "--plot", "--ddp-params"):
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


# -- the DDP row's plumbing ------------------------------------------------------------


def test_ddp_is_not_in_the_default_ops_and_runs_on_the_torch_backend_and_gloo_only() -> None:
    assert build_parser().parse_args([]).ops == OPS
    for op in ("ddp", "ddp_compute", "ddp_flat", "fsdp"):
        assert [s.api for s in SERIES.values() if runs(s, op)] == ["backend", "torch"]
    assert [s.api for s in SERIES.values() if runs(s, "all_reduce")] == ["await", "facade", "backend", "torch", "mpi4py"]
    chosen = _series(build_parser().parse_args(["--ops", "all_reduce,ddp", "--api", "both", "--compare", "gloo"]))
    assert [s.api for s in chosen] == ["await", "facade", "backend", "torch"]
    assert [s.api for s in _series(build_parser().parse_args(["--ops", "ddp"]))] == ["backend"]
    assert [s.api for s in _series(build_parser().parse_args(["--ops", "fsdp"]))] == ["backend"]
    assert [s.api for s in _series(build_parser().parse_args(["--ops", "all_reduce"]))] == ["await"]


def test_ddp_stands_for_its_three_rows_and_api_torch_for_the_facade_and_the_backend() -> None:
    assert STEP_OPS == ("ddp_compute", "ddp_flat", "ddp")
    assert build_parser().parse_args(["--ops", "barrier,ddp,ddp_flat"]).ops == ["barrier", *STEP_OPS]
    chosen = _series(build_parser().parse_args(["--ops", "all_reduce", "--api", "torch"]))
    assert [(s.library, s.api) for s in chosen] == [("asyncdist", "facade"), ("asyncdist", "backend")]


def test_the_fsdp_models_parameter_count_is_its_formula() -> None:
    torch = pytest.importorskip("torch")
    from torch import nn

    d, ff = fsdp.WIDTH, 4 * fsdp.WIDTH
    layer = nn.TransformerEncoderLayer(d, fsdp.HEADS, ff, dropout=0.0, batch_first=True)
    model = [nn.Embedding(fsdp.VOCAB, d), nn.Linear(d, fsdp.VOCAB)] + [layer] * fsdp.LAYERS
    assert fsdp.params() == sum(p.numel() for m in model for p in m.parameters())
    assert torch.is_tensor(next(layer.parameters()))


@pytest.mark.parametrize("params", [1, 4000, 10**7])
def test_the_mlp_is_sized_by_its_parameter_count(params: int) -> None:
    width = mlp_width(params)
    assert width == 1 or LAYERS * width**2 <= params < LAYERS * (width + 1) ** 2  # weights; biases add 0.1 % at 10M
    assert mlp_width(mlp_params(width)) == width  # the parent's count is the rank's model
    assert mlp_params(3) == LAYERS * (9 + 3)


def test_ddp_params_accepts_decimal_suffixes(capsys: pytest.CaptureFixture[str]) -> None:
    assert build_parser().parse_args(["--ddp-params", "10M"]).ddp_params == 10_000_000
    assert build_parser().parse_args(["--ddp-params", "4000"]).ddp_params == 4000
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--ddp-params", "lots"])
    assert "positive count" in capsys.readouterr().err


def test_the_ddp_row_has_one_count_and_float32_whatever_the_sweep() -> None:
    assert jobs(["ddp", "barrier"], [8, 64], 8, 2, fixed={"ddp": 3968}) == (Job("ddp", 3968), Job("barrier", 0))
    plan = Plan(world_size=2, dtype="float64", array="torch", jobs=(Job("ddp", 3968),), reps=3)
    samples = [[Sample(1, (3e-3, 1e-3, 2e-3))], [Sample(1, (1e-3, 4e-3, 1e-3))]]
    (row,) = combine(SERIES["backend"], plan, samples)
    assert (row.dtype, row.nbytes, row.count, row.busbw) == ("float32", 4 * 3968, 3968, None)
    assert row.time_us == pytest.approx(3e3)  # max over ranks (3, 4, 2 ms), then the median
    assert CASES["ddp"].torch_api and CASES["ddp"].one_per_rep


# -- tiny sweeps on real rank processes --------------------------------------------------


def test_tiny_sweep_asyncdist_alone(capsys: pytest.CaptureFixture[str]) -> None:
    out, err = run(capsys, *TINY)
    assert out.startswith("# asyncdist-bench --world-size 2")
    assert "asyncdist" in out.splitlines()[1] and "loop" in out.splitlines()[1]
    assert table_titles(out) == OPS
    assert "gloo" not in out and "running asyncdist (await API)" in err
    floor_line = next(line for line in out.splitlines() if "socket floor" in line)
    assert "blocking sockets" in floor_line and "xfloor" in out


def test_the_socket_floor_is_two_positive_one_way_times() -> None:
    measured = floor.measure()
    assert 0 < measured.us == min(measured.blocking_us, measured.uvloop_us)
    assert measured.loop in ("uvloop", "asyncio")


def test_small_rows_are_shown_as_multiples_of_the_floor() -> None:
    plan = Plan(world_size=2, dtype="float32", array="numpy", jobs=(Job("all_reduce", 2), Job("all_reduce", 1 << 20),
                                                                   Job("barrier", 0)), reps=1)
    samples = [[Sample(1, (40e-6,)), Sample(1, (1e-3,)), Sample(1, (20e-6,))]] * 2
    rows = combine(SERIES["await"], plan, samples)
    lines = report.tables(rows, [SERIES["await"]], floor.Floor(10.0, 12.0, "uvloop"))
    cells = {line.split()[0]: line.split() for line in lines if line and not line.startswith(("#", " #")) and line.strip()}
    assert cells["8"][4] == "4.0" and cells["0"][4] == "2.0"  # 40 us and 20 us over a 10 us floor
    assert cells[str(4 << 20)][4] == "-"  # large rows move data: no multiple


def test_progress_line_rewrites_one_line_and_clears_it() -> None:
    stream = io.StringIO()
    progress = Progress(2, True, stream)
    progress.job(0, Job("all_reduce", 256), 1024)
    progress.job(1, Job("barrier", 0), 0)
    progress.done()
    text = stream.getvalue()
    assert "\r  [1/2] all_reduce 1K" in text and "\r  [2/2] barrier" in text and "\n" not in text
    assert text.endswith("\r")
    quiet = io.StringIO()
    Progress(2, False, quiet).job(0, Job("barrier", 0), 0)
    assert quiet.getvalue() == ""


def test_compare_mpi_is_left_out_with_a_note_where_mpi_is_missing(capsys, monkeypatch) -> None:
    monkeypatch.setattr(mpi, "missing", lambda dtype="float32": "mpi4py is not installed (pip install mpi4py)")
    out, err = run(capsys, *TINY, "--ops", "barrier", "--compare", "mpi")
    assert "note: --compare mpi: mpi4py is not installed" in err and "the MPI column is left out" in err
    assert "mpi" not in out.split("# barrier")[1]


def test_compare_mpi_adds_a_column_and_a_ratio(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    if mpi.missing():
        pytest.skip(mpi.missing() or "")
    path = tmp_path / "bench.json"
    out, err = run(capsys, *TINY, "--ops", "all_reduce,barrier,sendrecv", "--compare", "mpi", "--json", str(path))
    assert "(mpi/asyncdist)" in out and "running MPI (mpi4py)" in err
    rows = json.loads(path.read_text())["rows"]
    assert {(row["op"], row["library"]) for row in rows} == {
        (op, lib) for op in ("all_reduce", "barrier", "sendrecv") for lib in ("asyncdist", "mpi")}
    assert all(row["mpi_ratio"] > 0 for row in rows if row["library"] == "asyncdist")


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


def test_plot_without_matplotlib_fails_before_the_sweep(capsys, monkeypatch, tmp_path) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    path = tmp_path / "bench.png"
    with pytest.raises(SystemExit) as exit_info:
        main([*TINY, "--ops", "barrier", "--plot", str(path)], prog="asyncdist-bench")
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert "--plot needs matplotlib" in captured.err and "asyncdist[plot]" in captured.err
    assert "running" not in captured.err and not path.exists()  # refused before any rank started


def test_plot_is_written_with_matplotlib(capsys, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "bench.png"
    run(capsys, *TINY, "--ops", "all_reduce,barrier", "--plot", str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tiny_ddp_row_against_gloo(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    pytest.importorskip("torch")
    path = tmp_path / "ddp.json"
    out, err = run(capsys, "--world-size", "2", "--ops", "ddp", "--compare", "gloo", "--ddp-params", "4K",
                   "--warmup", "1", "--reps", "3", "--json", str(path))
    assert table_titles(out) == list(STEP_OPS)
    assert "# ddp: MLP of 3,968 parameters (4 x Linear(31, 31)" in out
    assert "asyncdist backend" in out and "(gloo/asyncdist)" in out and "gloo / asyncdist (torch.distributed backend)" in out
    assert "running asyncdist (torch.distributed backend): 3 jobs" in err and "await API" not in err
    report = json.loads(path.read_text())
    assert report["config"]["series"] == ["asyncdist:backend", "gloo:torch"]
    assert report["config"]["ddp_model"].startswith("MLP of 3,968 parameters")
    rows = {(row["library"], row["api"], row["op"]): row for row in report["rows"]}
    assert set(rows) == {(*series, op) for series in [("asyncdist", "backend"), ("gloo", "torch")] for op in STEP_OPS}
    for row in rows.values():
        assert ROW_FIELDS <= row.keys()
        assert (row["count"], row["bytes"], row["dtype"]) == (3968, 4 * 3968, "float32")
        assert row["iters"] == 1 and len(row["reps_us"]) == 3 and row["busbw_gbps"] is None
        assert row["time_us"] == sorted(row["reps_us"])[1] > 0  # the median step
    ratio = rows[("asyncdist", "backend", "ddp")]["gloo_ratio"]
    assert ratio == pytest.approx(rows[("gloo", "torch", "ddp")]["time_us"] / rows[("asyncdist", "backend", "ddp")]["time_us"])
    # The breakdown: each backend's three steps, in ms, and the DDP step minus the compute-only step.
    breakdown = {line.split(":")[0].strip("# "): line for line in out.splitlines() if "compute only " in line and "exposed " in line}
    assert set(breakdown) == {"asyncdist backend", "gloo"}
    for label, (library, api) in {"asyncdist backend": ("asyncdist", "backend"), "gloo": ("gloo", "torch")}.items():
        compute, flat, step = (rows[(library, api, op)]["time_us"] / 1e3 for op in STEP_OPS)
        assert f"compute only {compute:7.2f}, no overlap {flat:7.2f}, DDP {step:7.2f}" in breakdown[label]
        assert f"exposed {step - compute:+7.2f}" in breakdown[label]


def test_tiny_torch_api_series_against_the_facade(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    pytest.importorskip("torch")
    path = tmp_path / "torch.json"
    out, err = run(capsys, *TINY, "--ops", "all_reduce,all_gather,barrier", "--api", "torch", "--json", str(path))
    assert table_titles(out) == ["all_reduce", "all_gather", "barrier"]
    assert "(torch/facade)" in out and "torch backend / facade time per size (target <= 1.15):" in out
    report = json.loads(path.read_text())
    assert report["config"]["series"] == ["asyncdist:facade", "asyncdist:backend"]
    rows = {(row["api"], row["op"], row["bytes"]): row for row in report["rows"]}
    assert {key[1:] for key in rows} == {("all_reduce", 8), ("all_reduce", 64), ("all_gather", 8), ("all_gather", 64),
                                         ("barrier", 0)}
    for (api, op, nbytes), row in rows.items():
        assert row["time_us"] > 0
        if api == "backend":
            facade = rows[("facade", op, nbytes)]
            assert row["facade_ratio"] == pytest.approx(row["time_us"] / facade["time_us"])


def test_tiny_fsdp_row_against_gloo(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    pytest.importorskip("torch")
    path = tmp_path / "fsdp.json"
    out, _ = run(capsys, "--world-size", "2", "--ops", "fsdp", "--compare", "gloo", "--warmup", "1", "--reps", "2",
                 "--json", str(path))
    assert table_titles(out) == ["fsdp"] and f"# fsdp: {fsdp.describe()}" in out
    rows = json.loads(path.read_text())["rows"]
    assert {(row["library"], row["api"]) for row in rows} == {("asyncdist", "backend"), ("gloo", "torch")}
    for row in rows:
        assert (row["op"], row["count"], row["bytes"]) == ("fsdp", fsdp.params(), 4 * fsdp.params())
        assert row["iters"] == 1 and len(row["reps_us"]) == 2 and row["time_us"] > 0


def test_scale_counts_messages_and_bytes_per_rank(capsys: pytest.CaptureFixture[str]) -> None:
    out, err = run(capsys, "--scale", "1,3,8", "-b", "64K", "-e", "64K")
    rows = [line.split("|")[1:-1] for line in out.splitlines()[2:]]
    cells = {(r[0].strip(), int(r[2])): (int(r[3]), float(r[4])) for r in rows}
    assert set(cells) == {(op, n) for op in ("all_reduce", "broadcast") for n in (1, 3, 8)}
    assert cells[("all_reduce", 1)] == (0, 0.0) and cells[("broadcast", 1)] == (0, 0.0)
    assert cells[("all_reduce", 8)] == (6, 1.75)  # halving + doubling: 2 log2 8 messages, 2(n-1)/n of the data
    assert cells[("all_reduce", 3)] == (4, 1.33)  # ring below 8 ranks: 2(n-1) messages, 2(n-1)/n of the data
    # The chain: the message once per rank, and nothing more: ranks that agree send no announcement.
    assert cells[("broadcast", 8)] == (1, 1.0)
    assert "scale: broadcast 64K" in err

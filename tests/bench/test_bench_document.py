"""``asyncdist-bench --report``: the Markdown renderer, the copy-bandwidth bound, and one
small end-to-end page.

Benchmarks are not tests: nothing here looks at how fast anything was.
"""

from __future__ import annotations

import re

import pytest

from asyncdist.bench import markdown, memcpy, mpi, plot
from asyncdist.bench.cli import main
from asyncdist.bench.floor import Floor
from asyncdist.bench.plan import SERIES, Series
from asyncdist.bench.runner import Row

AWAIT, FACADE, GLOO = SERIES["await"], SERIES["facade"], SERIES["gloo"]


def row(series: Series, op: str, nbytes: int, time_us: float, overhead_us: float | None = None) -> Row:
    return Row(op=op, nbytes=nbytes, count=nbytes // 4, dtype="float32", series=series, world_size=2,
               time_us=time_us, algbw=None, busbw=None, iters=1, reps_us=(time_us,), overhead_us=overhead_us)


def cells(lines: list[str], first: str) -> dict[str, str]:
    """The table row whose first cell is ``first``, by its column heading."""
    headings = next(line for line in lines if line.startswith("| size |")).strip("|").split("|")
    found = next(line for line in lines if line.startswith(f"| {first} |")).strip("|").split("|")
    return {h.strip(): c.strip() for h, c in zip(headings, found, strict=True)}


# -- the Markdown renderer -----------------------------------------------------------------


def test_markdown_tables_show_times_floors_overhead_and_ratios() -> None:
    rows = [
        row(AWAIT, "all_reduce", 8, 40.0), row(FACADE, "all_reduce", 8, 52.0, overhead_us=12.0),
        row(GLOO, "all_reduce", 8, 150.0),
        row(AWAIT, "all_reduce", 1 << 20, 1234.0), row(FACADE, "all_reduce", 1 << 20, 1300.0),
        row(GLOO, "all_reduce", 1 << 20, 3702.0),
    ]
    lines = markdown.markdown_tables(rows, [AWAIT, FACADE, GLOO], Floor(10.0, 12.0, "uvloop"))
    assert lines[:2] == ["### all_reduce, 2 ranks", ""]  # no note: its busbw clause is all it has
    assert lines[2] == ("| size | asyncdist (us) | asyncdist xfloor | asyncdist facade (us) | asyncdist facade xfloor "
                        "| gloo (us) | facade overhead (us) | gloo / asyncdist | gloo / asyncdist facade |")
    assert lines[3] == "|---|" + "---:|" * 8
    small, large = cells(lines, "8 B"), cells(lines, "1 MiB")
    assert small["asyncdist (us)"] == "40.0" and small["gloo (us)"] == "150"
    assert small["asyncdist xfloor"] == "4.0" and small["asyncdist facade xfloor"] == "5.2"  # over the lower floor
    assert small["facade overhead (us)"] == "+12.0"
    assert small["gloo / asyncdist"] == f"{150 / 40:.2f}" == "3.75"
    assert small["gloo / asyncdist facade"] == f"{150 / 52:.2f}" == "2.88"
    assert large["asyncdist (us)"] == "1,234" and large["asyncdist xfloor"] == "-"  # large rows move data
    assert large["gloo / asyncdist"] == "3.00" and large["facade overhead (us)"] == "-"


def test_markdown_tables_leave_out_columns_no_row_has() -> None:
    lines = markdown.markdown_tables([row(AWAIT, "barrier", 0, 30.0)], [AWAIT, FACADE, GLOO])
    assert lines[2] == "time per barrier"
    assert lines[4] == "| size | asyncdist (us) |"  # no floor given, no facade or gloo row
    assert lines[6] == "| - | 30.0 |"


def test_markdown_summary_is_the_geometric_mean_of_the_ratios() -> None:
    rows = [row(AWAIT, "broadcast", 8, 10.0), row(GLOO, "broadcast", 8, 40.0),
            row(AWAIT, "broadcast", 64, 10.0), row(GLOO, "broadcast", 64, 10.0)]
    assert markdown.markdown_summary(rows, [AWAIT, GLOO]) == [
        "| op | gloo / asyncdist |", "|---|---:|", f"| broadcast | {(4.0 * 1.0) ** 0.5:.2f} |"]


@pytest.mark.parametrize(("nbytes", "text"),
                         [(0, "-"), (8, "8 B"), (1000, "1000 B"), (1024, "1 KiB"), (64 << 20, "64 MiB")])
def test_size_text(nbytes: int, text: str) -> None:
    assert markdown.size_text(nbytes) == text


# -- the copy-bandwidth bound --------------------------------------------------------------


@pytest.mark.parametrize(("op", "n", "cores", "copied"), [
    # copied: the bytes the busiest core copies per call, worked out by hand for a 64 MiB row
    ("all_reduce", 2, 2, 64 << 20),  # each rank receives 2(2-1)/2 = 1 x size, one core each
    ("all_reduce", 4, 2, 4 * 1.5 * (64 << 20) / 2),  # 4 ranks receive 1.5 x size each, on 2 cores
    ("broadcast", 2, 2, 64 << 20),  # one receiver
    ("broadcast", 4, 2, 3 * (64 << 20) / 2),  # 3 receivers on 2 cores
    ("all_gather", 4, 8, 0.75 * (64 << 20)),  # 4 receivers, cores to spare
    ("reduce_scatter", 2, 1, 2 * 0.5 * (64 << 20)),  # 2 receivers on 1 core
    ("sendrecv", 4, 2, 64 << 20),  # one leg: one receiver
])
def test_the_least_time_is_the_busiest_cores_copy_at_the_bandwidth(op: str, n: int, cores: int, copied: float) -> None:
    gbps = 5.0
    assert memcpy.least_us(op, 64 << 20, n, gbps, cores) == pytest.approx(copied / 5e9 * 1e6)


def test_ops_without_data_have_no_bound_and_the_bandwidth_is_positive() -> None:
    assert memcpy.least_us("barrier", 0, 2, 5.0, 2) is None and memcpy.bytes_per_rank("barrier", 0, 2) is None
    assert memcpy.copy_gbps(1 << 20, reps=2) > 0


# -- one small page, end to end ------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_report_writes_the_page(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    pytest.importorskip("torch")
    page = tmp_path / "page.md"
    tiny = ["--ops", "all_reduce,barrier", "-e", "64", "--warmup", "1", "--reps", "2", "--iters", "2"]
    assert main(["--report", str(page), "--quick", *tiny], prog="asyncdist-bench") == 0
    text = page.read_text()
    assert f"asyncdist-bench --report {page} --quick --ops all_reduce,barrier" in text
    headings = re.findall(r"^(#+ .*)$", text, re.M)
    for heading in ("# Benchmarks", "## The run", "## Floors of this machine", "## The gap to the hardware",
                    "## 2 ranks", "### all_reduce, 2 ranks", "### barrier, 2 ranks", "## 4 ranks",
                    "### all_reduce, 4 ranks", "## Python calls per operation", "## How to read the tables",
                    "## How to run"):
        assert heading in headings, heading
    assert "| quick |" in text and "No row of this run is 16 MiB or more." in text
    ratios = "| gloo / asyncdist | gloo / asyncdist facade |" + ("" if mpi.missing() else " mpi / asyncdist | mpi / asyncdist facade |")
    assert f"{ratios} facade overhead (us) |" in text
    assert "| all_reduce 8 B | rank |" in text and "facade dist.all_reduce, 8 B" in text
    if mpi.missing():
        assert f"the MPI (mpi4py) columns: {mpi.missing()}" in text
    if plot.missing():
        assert "plots: they need matplotlib" in text
    else:
        assert (tmp_path / "page" / "ranks2.png").read_bytes()[:4] == b"\x89PNG" and "(page/ranks4.png)" in text
    assert "running asyncdist (blocking facade): 3 jobs on 4 ranks" in capsys.readouterr().err


def test_report_refuses_the_flags_that_write_elsewhere(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--report", str(tmp_path / "page.md"), "--json"], prog="asyncdist-bench")
    assert exit_info.value.code == 2 and "--report writes the page alone" in capsys.readouterr().err


def test_the_page_shows_large_rows_as_multiples_of_the_least_time() -> None:
    from asyncdist.bench import document

    def sweep(n: int) -> document.Sweep:
        rows = [Row("all_reduce", 64 << 20, 16 << 20, "float32", s, n, t, None, None, 1, (t,))
                for s, t in ((AWAIT, 30000.0), (GLOO, 90000.0))]
        return document.Sweep(n, [AWAIT, GLOO], rows, ["# the method"])

    env = {"asyncdist": "0", "python": "3", "torch": "-", "numpy": "2", "loop": "asyncio", "platform": "p", "cpus": "2"}
    facade = {"totals": [1], "median": {"asyncdist": 1, "asyncio": 0, "other": 0, "c_calls": 0}, "every": [], "some": [],
              "tensor": "NumPy"}
    page = document.render(document.Measured("cmd", "today", env, "default", Floor(10.0, 12.0, "asyncio"), 5.0,
                                             [sweep(2), sweep(4)], {}, facade, {}, []))
    # 2 ranks: each receives 64 MiB, one core each; 4 ranks: 4 x 96 MiB on 2 cores; at 5 GB/s
    least2, least4 = (64 << 20) / 5e3, 4 * 1.5 * (64 << 20) / 2 / 5e3
    assert f"| 2 | all_reduce | 64 MiB | {least2:,.0f} | {30000 / least2:.1f} | {90000 / least2:.1f} |" in page
    assert f"| 4 | all_reduce | 64 MiB | {least4:,.0f} | {30000 / least4:.1f} | {90000 / least4:.1f} |" in page
    assert "A smoke run" not in page and "Left out" not in page

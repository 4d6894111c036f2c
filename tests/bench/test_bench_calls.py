"""The call counter counts exactly and by the right origin; ``python -m asyncdist.bench.calls``
runs and prints its table (counts, never timings)."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from asyncdist.bench import call_counter, calls, cli, plan
from asyncdist.bench.call_counter import CallCounter, origin
from asyncdist.timeouts import as_seconds

entered = 0


def fib(n: int) -> int:
    """Recursive Fibonacci, counting its own calls in ``entered`` (the reference)."""
    global entered
    entered += 1
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def test_the_counter_counts_a_plain_functions_calls_exactly() -> None:
    global entered
    entered = 0
    counter = CallCounter()
    with counter:
        fib(15)
    assert entered == 1973  # 2 * fib(16) - 1
    assert dict(counter.calls) == {fib.__code__: entered}  # nothing else, not even the counter's exit
    assert sum(counter.c_calls.values()) == 0
    with counter:  # entering again adds
        fib(3)
    assert dict(counter.calls) == {fib.__code__: 1973 + 5}


def test_c_calls_are_counted_apart_by_their_caller() -> None:
    def lengths() -> int:
        return len("ab") + len("c")

    counter = CallCounter()
    with counter:
        lengths()
    assert dict(counter.calls) == {lengths.__code__: 1}
    assert dict(counter.c_calls) == {lengths.__code__: 2}


def test_the_split_by_origin_and_the_library_files() -> None:
    assert origin(as_seconds.__code__) == "asyncdist"
    assert origin(asyncio.isfuture.__code__) == "asyncio"
    assert origin(json.dumps.__code__) == "other"
    assert origin(fib.__code__) == "other"
    assert origin(plan.format_bytes.__code__) == "other"  # the benchmark drives; it is not the library's work
    counter = CallCounter()
    with counter:
        as_seconds(None, default=1.0, what="t")  # enters no other Python function
        asyncio.isfuture(None)  # enters no other Python function
        asyncio.isfuture(None)  # enters no other Python function
        fib(2)
        plan.format_bytes(8)
    assert counter.by_origin() == {"asyncdist": 1, "asyncio": 2, "other": 4}
    assert counter.library_files() == ["asyncdist/timeouts.py"]
    assert call_counter.library_file(as_seconds.__code__) == "asyncdist/timeouts.py"
    assert call_counter.library_file(calls.count_ops.__code__) is None


@pytest.mark.parametrize("loop", calls.available_loops())
def test_a_short_run_counts_every_operation_and_prints_the_table(loop: str) -> None:
    rows = calls.count_ops(iters=5, rounds=2, warmup=3, loop=loop)
    assert list(rows) == [*calls.OPS, calls.HARNESS]
    for name in calls.OPS:
        row = rows[name]
        assert row.calls["asyncdist"] > 0 and row.total > 0 and row.c_calls > 0 and row.files > 0, row
        assert len(row.totals) == 2 and min(row.totals) > 0
    assert rows["send+recv 8 B"].per == "pair" and rows["all_reduce 8 B"].per == "rank"
    assert rows[calls.HARNESS].calls["asyncdist"] == 0 and rows[calls.HARNESS].files == 0
    lines = calls.table(rows)
    assert lines[0] == ("| operation | per | Python calls | asyncdist | asyncio | other "
                        "| least round | C calls | asyncdist files |")
    number = r"\d+\.\d"
    for line, name in zip(lines[2:], rows, strict=True):
        assert re.fullmatch(rf"\| {re.escape(name)} \| (rank|pair)( \| {number}){{6}} \| \d+ \|", line), line


@pytest.mark.skipif("uvloop" not in calls.available_loops(), reason="uvloop is not installed")
def test_uvloop_runs_its_machinery_in_c() -> None:
    """The same operations, counted on both loops: asyncdist's own share is the
    same but for the one more read per readable event that uvloop needs
    (transport/stream.py), and asyncio's Python share shrinks to what
    asyncio.gather itself runs."""
    on_asyncio, on_uvloop = (calls.count_ops(iters=20, rounds=1, warmup=5, loop=loop) for loop in ("asyncio", "uvloop"))
    for name in calls.OPS:
        assert abs(on_uvloop[name].calls["asyncdist"] - on_asyncio[name].calls["asyncdist"]) <= 2, name
        assert on_uvloop[name].calls["asyncio"] < on_asyncio[name].calls["asyncio"] / 3, name


def test_the_command_line_counts_and_names_the_facades_files(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--count-calls", "--iters", "3"]) == 0
    out = capsys.readouterr().out
    assert "| all_reduce 8 B | rank |" in out and "| send+recv 8 B | pair |" in out
    assert all(f"{calls.LOOPS[loop]}:" in out for loop in calls.available_loops())
    found = re.search(r"facade dist\.all_reduce, 8 B \w+ tensor, 2 processes, rank 0, all threads, 25 calls counted "
                      r"one by one: Python calls per call least (\d+), median (\d+) \(asyncdist (\d+), asyncio \d+, "
                      r"other \d+; \d+ C calls\)\nasyncdist files entered by one call: (\d+) by every call, (\d+) more by some\n"
                      r"((?:  asyncdist/\S+\.py\n)+)((?:  asyncdist/\S+\.py \(some calls\)\n)*)", out)
    assert found, out
    least, median, library, every, some = map(int, found.groups()[:5])
    assert 0 < least <= median and 0 < library <= median
    files = found.group(6).split()
    assert every == len(files) and files == sorted(files)
    assert some == len(found.group(7).splitlines())
    assert {"asyncdist/facade/reductions.py", "asyncdist/group/forwarding.py"} <= set(files)

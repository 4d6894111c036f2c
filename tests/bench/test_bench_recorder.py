"""``python -m asyncdist.bench.recorder`` runs and reports its paired figure (never a timing check)."""

from __future__ import annotations

import importlib.util
import re

import pytest

from asyncdist.bench import recorder


@pytest.mark.parametrize(("flags", "what", "pairs"), [
    pytest.param([], "facade 8 B all_reduce, 2 ranks", 6,
                 marks=pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the facade needs torch")),
    (["--cpu"], "await API 8 B all_reduce, 2 ranks in one loop, CPU time per call and rank", 3),
])
def test_the_recorder_bench_prints_both_medians_and_their_paired_difference(
    capsys: pytest.CaptureFixture[str], flags: list[str], what: str, pairs: int
) -> None:
    assert recorder.main([*flags, "--block", "20", "--pairs", "3"]) == 0
    line = capsys.readouterr().out.strip()
    number = r"([+-]?[\d.]+)"
    found = re.fullmatch(rf"{re.escape(what)}: recorder on {number} us, off {number} us; "
                         rf"paired difference {number} us \(quartiles {number} to {number}\); "
                         rf"mean {number} us \(95 % interval {number} to {number}\), {pairs} pairs", line)
    assert found, line
    on, off, difference, low, high, mean, mean_low, mean_high = map(float, found.groups())
    assert on > 0 and off > 0 and low <= difference <= high and mean_low <= mean <= mean_high


def test_the_cpu_timing_switches_both_ranks_recorders_per_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each timed block runs with both ranks' recorders as asked: on blocks add
    records (2 ranks x block calls), off blocks add none."""
    from asyncdist.flight.record_ring import PyRecordRing

    opened: list[bool] = []
    real_open = PyRecordRing.open

    def counting_open(self: PyRecordRing, *args: object) -> object:
        handle = real_open(self, *args)  # type: ignore[arg-type]
        opened.append(handle is not None)
        return handle

    monkeypatch.setattr(PyRecordRing, "open", counting_open)
    assert recorder._cpu_pairs(block=5, pairs=0, ring="python") == {"on_us": [], "off_us": []}
    assert opened == [True] * 2 * 5  # the warm-up block
    opened.clear()
    times = recorder._cpu_pairs(block=5, pairs=2, ring="python")
    assert len(times["on_us"]) == len(times["off_us"]) == 2
    # the warm-up, then on/off and off/on: 3 blocks recorded and 2 not, 2 ranks x 5 calls each
    assert sum(opened) == 3 * 2 * 5 and len(opened) - sum(opened) == 2 * 2 * 5


def test_the_summary_of_paired_timings() -> None:
    on, off = [10.0, 12.0, 11.0, 15.0], [9.0, 9.5, 10.0, 11.0]  # differences 1, 2.5, 1, 4
    figures = recorder.summary(on, off)
    assert (figures["on_us"], figures["off_us"]) == (11.5, 9.75)
    assert figures["difference_us"] == 1.75 and figures["mean_us"] == 2.125
    assert (figures["q1_us"], figures["q3_us"]) == (1.0, 2.5)
    assert 1.0 <= figures["low_us"] <= 2.125 <= figures["high_us"] <= 4.0

"""``python -m asyncdist.bench.recorder`` runs and reports its paired figure (never a timing check)."""

from __future__ import annotations

import re

import pytest

from asyncdist.bench import recorder


def test_the_recorder_bench_prints_both_medians_and_their_paired_difference(capsys: pytest.CaptureFixture[str]) -> None:
    assert recorder.main(["--block", "20", "--pairs", "3"]) == 0
    line = capsys.readouterr().out.strip()
    number = r"([+-]?[\d.]+)"
    found = re.fullmatch(rf"facade 8 B all_reduce, 2 ranks: recorder on {number} us, off {number} us; "
                         rf"paired difference {number} us \(quartiles {number} to {number}\); "
                         rf"mean {number} us \(95 % interval {number} to {number}\), 6 pairs of both ranks", line)
    assert found, line
    on, off, difference, low, high, mean, mean_low, mean_high = map(float, found.groups())
    assert on > 0 and off > 0 and low <= difference <= high and mean_low <= mean <= mean_high


def test_the_summary_of_paired_timings() -> None:
    on, off = [10.0, 12.0, 11.0, 15.0], [9.0, 9.5, 10.0, 11.0]  # differences 1, 2.5, 1, 4
    figures = recorder.summary(on, off)
    assert (figures["on_us"], figures["off_us"]) == (11.5, 9.75)
    assert figures["difference_us"] == 1.75 and figures["mean_us"] == 2.125
    assert (figures["q1_us"], figures["q3_us"]) == (1.0, 2.5)
    assert 1.0 <= figures["low_us"] <= 2.125 <= figures["high_us"] <= 4.0

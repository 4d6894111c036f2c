"""``python -m asyncdist.bench.recorder`` runs and reports its paired figure (never a timing check)."""

from __future__ import annotations

import re

import pytest

from asyncdist.bench import recorder


def test_the_recorder_bench_prints_both_medians_and_their_paired_difference(capsys: pytest.CaptureFixture[str]) -> None:
    assert recorder.main(["--block", "20", "--pairs", "3"]) == 0
    line = capsys.readouterr().out.strip()
    found = re.fullmatch(r"facade 8 B all_reduce, 2 ranks: recorder on ([\d.]+) us, off ([\d.]+) us; "
                         r"paired difference ([+-][\d.]+) us \(quartiles ([+-][\d.]+) to ([+-][\d.]+)\)", line)
    assert found, line
    on, off, difference, low, high = map(float, found.groups())
    assert on > 0 and off > 0 and low <= difference <= high

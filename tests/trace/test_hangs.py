"""A rank that skips a collective, and ranks that disagree about one: the live
warning, the dumps and ``asyncdist-trace analyze`` all name the culprit."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import numpy as np
import pytest

from asyncdist.errors import AsyncDistError
from asyncdist.testing import local_world
from asyncdist.trace.analyze import analyze
from asyncdist.trace.cli import main
from asyncdist.trace.load import load


class _Warnings(logging.Handler):
    """Collects the hang warnings; ``enough`` is set once ``count`` arrived."""

    def __init__(self, count: int) -> None:
        super().__init__(logging.WARNING)
        self.count, self.lines, self.enough = count, [], asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        if len(self.lines) >= self.count:
            self.enough.set()


@pytest.fixture
def hang_warnings(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("ASYNCDIST_HANG_WARN", "0.05")
    handler = _Warnings(count=2)
    logger = logging.getLogger("asyncdist.hang")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


async def test_a_rank_that_skips_a_call_is_named_by_every_waiting_rank_and_by_analyze(
    hang_warnings: _Warnings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with local_world(3) as ranks:
        x = [np.full(4, rank + 1.0) for rank in range(3)]
        await asyncio.gather(*(g.all_reduce(t) for g, t in zip(ranks, x)))
        # Rank 2 skips call #2: ranks 0 and 1 wait in it.
        waiting = [asyncio.ensure_future(g.all_reduce(t)) for g, t in zip(ranks[:2], x[:2])]
        await asyncio.wait_for(hang_warnings.enough.wait(), 30)
        for group in ranks:
            group.dump_trace(tmp_path)
        await ranks[2].all_reduce(x[2])  # it comes at last: the call completes everywhere
        await asyncio.gather(*waiting)
    for t in x:
        np.testing.assert_array_equal(t, np.full(4, 18.0))  # (1 + 2 + 3) * 3

    assert len(hang_warnings.lines) == 2
    for rank, line in zip((0, 1), sorted(hang_warnings.lines)):
        assert line.startswith(f"rank {rank}: all_reduce #2 on group local3 has waited "), line
        assert "for rank 2, which is at all_reduce #1 on group local3 (completed " in line, line

    findings = analyze(load(tmp_path))
    behind = [f for f in findings if f.kind == "behind"]
    assert [(f.ranks, f.group, f.call) for f in behind] == [([2], "local3", 2)]
    assert behind[0].text.startswith("rank 2 is behind on group local3: it is at all_reduce #1 on group local3")
    assert "ranks [0, 1] wait in call #2 (all_reduce(sum, float64[4]))" in behind[0].text

    assert main(["analyze", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ranks"] == [0, 1, 2] and report["missing"] == []
    assert [(f["kind"], f["ranks"], f["call"]) for f in report["findings"] if f["kind"] == "behind"] == [
        ("behind", [2], 2)]


async def test_ranks_that_disagree_dump_by_themselves_and_analyze_names_both_ops(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ASYNCDIST_TRACE_DIR", str(tmp_path))
    async with local_world(3, timeout=30) as ranks:
        t = [np.ones(4, np.float32) for _ in range(3)]
        outcomes = await asyncio.gather(
            ranks[0].all_reduce(t[0]), ranks[1].all_reduce(t[1]), ranks[2].broadcast(t[2], src=0),
            return_exceptions=True,
        )
    assert all(isinstance(outcome, AsyncDistError) for outcome in outcomes), outcomes

    trace = load(tmp_path)  # written by each rank on the failure, without being asked
    assert sorted(trace.dumps) == [0, 1, 2]
    assert all("collective mismatch" in dump.data["reason"] for dump in trace.dumps.values())
    mismatch, = (f for f in analyze(trace) if f.kind == "mismatch")
    assert (mismatch.group, mismatch.call, mismatch.ranks) == ("local3", 1, [0, 1, 2])
    assert mismatch.details["entered"] == {"all_reduce(sum, float32[4])": [0, 1], "broadcast(src=0, float32[4])": [2]}
    assert mismatch.details["differ"] == ["op", "root", "reduction"]
    assert "ranks [0, 1] entered all_reduce(sum, float32[4]); rank 2 entered broadcast(src=0, float32[4])" \
        in mismatch.text


async def test_a_blocking_recv_that_waits_names_its_peer_and_where_it_is(hang_warnings: _Warnings) -> None:
    hang_warnings.count = 1
    async with local_world(2) as ranks:
        out = np.zeros(3)
        receiving = asyncio.ensure_future(ranks[1].recv(out, src=0, tag=4))
        await asyncio.wait_for(hang_warnings.enough.wait(), 30)
        await ranks[0].send(np.arange(3.0), dst=1, tag=4)
        assert await receiving == 0
    np.testing.assert_array_equal(out, np.arange(3.0))
    line, = hang_warnings.lines
    assert line.startswith("rank 1: recv from rank 0 (tag 4, group 'local2') has waited "), line
    assert "for rank 0, which is at barrier #0 on group local2 (completed " in line, line


async def test_an_irecv_whose_work_waits_names_its_peer_and_where_it_is(hang_warnings: _Warnings) -> None:
    hang_warnings.count = 1
    async with local_world(2) as ranks:
        out = np.zeros(3)
        work = ranks[1].irecv(out, src=0, tag=6)
        await asyncio.wait_for(hang_warnings.enough.wait(), 30)
        assert not work.is_completed()
        await ranks[0].send(np.arange(3.0) + 1, dst=1, tag=6)
        await work
    np.testing.assert_array_equal(out, np.arange(3.0) + 1)
    line, = hang_warnings.lines
    assert line.startswith("rank 1: recv from rank 0 (tag 6, group 'local2') has waited "), line
    assert "for rank 0, which is at " in line, line

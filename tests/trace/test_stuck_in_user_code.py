"""A rank stuck in its own code: its loop thread still answers, captures every
thread's stack and dumps; the waiting ranks' warning and ``asyncdist-trace
analyze`` name the file, line and function where its main thread is."""

from __future__ import annotations

import json
import logging
import re
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

import asyncdist as dist
from asyncdist.errors import InvalidArgumentError, OperationTimeoutError
from asyncdist.flight.dumps import dump_file
from asyncdist.testing import spawn
from asyncdist.trace.analyze import analyze
from asyncdist.trace.cli import main
from asyncdist.trace.load import load

TIMEOUT = 2.0  # the group's timeout: ranks 0 and 1 give up on all_reduce #2 then
HANG_WARN = 0.5  # their hang warning asks rank 2 where it is before that
BOUND = 20.0  # how long anything here waits at most


def _load_batch() -> None:
    """Rank 2's stuck data loader (``spawn`` ends rank 2 once rank 0 or 1 fails)."""
    time.sleep(BOUND)  # rank 2 stalls here


def _rank(folder: str) -> None:
    """Two all_reduces; rank 2 never makes the second. Ranks 0 and 1 keep their
    hang warnings in a file, and fail once rank 2 has dumped at their failure."""
    warnings: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("asyncdist.hang").addHandler(handler)
    dist.init_process_group(timeout=timedelta(seconds=TIMEOUT))
    rank = dist.get_rank()
    x = np.ones(4)
    dist.all_reduce(x)
    if rank == 2:
        _load_batch()
    try:
        dist.all_reduce(x)
    finally:
        (Path(folder) / f"warnings{rank}.json").write_text(json.dumps(warnings))
        deadline = time.monotonic() + BOUND
        while not _dumped_at_a_failure(folder) and time.monotonic() < deadline:
            time.sleep(0.01)


def _dumped_at_a_failure(folder: str) -> bool:
    """Whether rank 2's dump holds the stacks it took at a failure of rank 0 or 1."""
    try:
        return "failed a call" in load(dump_file(folder, 2)).dumps[2].stacks[-1]["reason"]
    except (InvalidArgumentError, IndexError):
        return False


def _stall_line() -> tuple[int, str]:
    """The line where rank 2 stalls, and its source, read from this file."""
    source = Path(__file__).read_text().splitlines()
    marker = "  # rank 2 stalls here"
    return next((n, line.strip()[: -len(marker)]) for n, line in enumerate(source, 1) if line.endswith(marker))


def test_a_rank_stuck_in_user_code_is_found_at_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = str(tmp_path)
    env = {"ASYNCDIST_TRACE_DIR": folder, "ASYNCDIST_HANG_WARN": str(HANG_WARN)}
    timed_out = r"all_reduce\(sum, float64\[4\]\) \(call #2 in group 'world'\) Timed out after 2 s"
    with pytest.raises(OperationTimeoutError, match=timed_out):
        spawn(3, _rank, folder, timeout=60, env=env)
    line_number, code = _stall_line()
    where = f"{Path(__file__).name}:{line_number} in _load_batch ({code}), outside any asyncdist call"

    # The live warning of ranks 0 and 1 says where rank 2's main thread is.
    for rank in (0, 1):
        (line,) = json.loads((tmp_path / f"warnings{rank}.json").read_text())
        assert line.startswith(f"rank {rank}: all_reduce #2 on group world has waited "), line
        assert re.search(r"for rank 2, which is at all_reduce #1 on group world \(completed [0-9.]+ s ago\); "
                         r"its main thread is in \S+", line), line
        assert line.endswith(where), line

    # Rank 2 failed nothing, yet dumped: at the question, then at the others' failure (an ABORT).
    dump = load(dump_file(tmp_path, 2)).dumps[2]
    reasons = [capture["reason"] for capture in dump.stacks]
    assert reasons[0] in {f"rank {r}'s hang warning asked where this rank is" for r in (0, 1)}, reasons
    assert reasons[-1] in {f"rank {r} failed a call (OperationTimeoutError)" for r in (0, 1)}, reasons
    assert dump.data["version"] == 2 and [e["seq"] for e in dump.entries][-1] == 1

    findings = analyze(load(tmp_path))
    (behind,) = [f for f in findings if f.kind == "behind"]
    assert (behind.ranks, behind.group, behind.call) == ([2], "world", 2)
    assert behind.text.endswith(f"; rank 2's main thread is in tests/trace/{where}"), behind.text
    stack = behind.details["stack"]
    assert (stack["file"], stack["line"], stack["function"], stack["inside"]) == (
        __file__, line_number, "_load_batch", None)

    assert main(["analyze", folder]) == 0
    assert f"rank 2's main thread is in tests/trace/{where}" in capsys.readouterr().out

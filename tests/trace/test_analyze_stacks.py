"""``asyncdist-trace analyze`` says where a rank that is behind is, from the
stack in its dump or in its answer to a hang warning (constructed dumps)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from asyncdist.flight.descriptions import describe
from asyncdist.flight.dumps import Dumps, dump_file
from asyncdist.flight.recorder import Recorder
from asyncdist.trace.analyze import analyze, as_text, location
from asyncdist.trace.load import load

ALL_REDUCE = describe("all_reduce", reduce="sum", dtype="float32", shape=(4,))


def _frame(file: str, line: int, function: str, code: str, origin: str) -> dict[str, Any]:
    return {"file": file, "line": line, "function": function, "code": code, "origin": origin}


# Rank 2's main thread sleeps in job.py; its loop thread took the capture.
STUCK = {"reason": "rank 0's hang warning asked where this rank is", "time": 5.0, "cwd": "/home/u/run", "threads": [
    {"name": "MainThread", "ident": 1, "main": True, "loop": False, "daemon": False, "frames": [
        _frame("/home/u/run/job.py", 12, "<module>", "main()", "user"),
        _frame("/home/u/run/job.py", 7, "main", "time.sleep(30)", "user"),
    ]},
    {"name": "asyncdist-loop", "ident": 2, "main": False, "loop": True, "daemon": True, "frames": [
        _frame("/usr/lib/python3.11/threading.py", 1002, "Thread._bootstrap", "self._bootstrap_inner()", "library"),
        _frame("/site/asyncdist/flight/stacks.py", 90, "capture", "...", "asyncdist"),
    ]},
]}  # fmt: skip
WHERE = "rank 2's main thread is in job.py:7 in main (time.sleep(30)), outside any asyncdist call"


def _recorder(rank: int) -> Recorder:
    """Ranks 0 and 1 wait in call #2 of world; rank 2 made only call #1."""
    recorder = Recorder(rank, capacity=16)
    for seq in (1, 2) if rank != 2 else (1,):
        handle = recorder.ring.open("collective", 1, "world", seq, ALL_REDUCE, (0, 1, 2), None, recorder.clock())
        if seq == 1:
            recorder.close(handle)
    return recorder


def _write(folder: Path, rank: int, recorder: Recorder | None = None, captures: list | None = None) -> None:
    dumps = Dumps(recorder or _recorder(rank), world_size=3, job_id="job", directory=str(folder))
    dumps.stacks = captures or []
    dumps.write(folder)


def _behind(folder: Path) -> Any:
    trace = load(folder)
    (finding,) = [f for f in analyze(trace) if f.kind == "behind"]
    assert (finding.ranks, finding.group, finding.call) == ([2], "world", 2)
    return trace, finding


def test_the_rank_behind_is_placed_at_its_innermost_user_frame(tmp_path: Path) -> None:
    for rank in (0, 1):
        _write(tmp_path, rank)
    _write(tmp_path, 2, captures=[{**STUCK, "threads": []}, STUCK])  # the latest capture tells
    trace, finding = _behind(tmp_path)
    assert finding.text == (
        "rank 2 is behind on group world: it is at all_reduce #1 on group world (all_reduce(sum, float32[4]), "
        f"completed), while ranks [0, 1] wait in call #2 (all_reduce(sum, float32[4])); {WHERE}")
    assert finding.details["stack"] == {"thread": "MainThread", "main": True, "file": "/home/u/run/job.py",
                                        "line": 7, "function": "main", "code": "time.sleep(30)", "inside": None}
    assert f"- {finding.text}" in as_text(trace, analyze(trace)).splitlines()
    assert location(trace, 0) is None  # no stacks in rank 0's dump


def test_a_rank_inside_an_asyncdist_call_is_said_to_be(tmp_path: Path) -> None:
    main = STUCK["threads"][0]
    in_call = {**main, "frames": [
        *main["frames"][:1], _frame("/home/u/run/job.py", 9, "main", "dist.barrier()", "user"),
        _frame("/site/asyncdist/facade/collectives.py", 40, "barrier", "...", "asyncdist")]}
    for rank in (0, 1):
        _write(tmp_path, rank)
    _write(tmp_path, 2, captures=[{**STUCK, "threads": [in_call]}])
    _, finding = _behind(tmp_path)
    assert finding.text.endswith(
        "; rank 2's main thread is in job.py:9 in main (dist.barrier()), inside asyncdist's barrier")
    assert finding.details["stack"]["inside"] == "barrier"


def test_a_version_1_dump_reads_as_before(tmp_path: Path) -> None:
    for rank in range(3):
        _write(tmp_path, rank)
    file = dump_file(tmp_path, 2)
    data = json.loads(file.read_text())
    del data["stacks"]
    file.write_text(json.dumps({**data, "version": 1}))
    trace, finding = _behind(tmp_path)
    assert trace.dumps[2].stacks == []
    assert finding.text.endswith("wait in call #2 (all_reduce(sum, float32[4]))") and finding.details["stack"] is None


def test_a_rank_that_left_no_dump_is_placed_by_its_answer(tmp_path: Path) -> None:
    """Rank 2 answered rank 0's hang warning with its stack, then died before it could dump."""
    recorder = _recorder(0)
    answer = _recorder(2).where(1)
    assert answer is not None
    recorder.heard[2] = {**answer, "stack": {"cwd": STUCK["cwd"], "threads": STUCK["threads"][:1]}, "asked": 1.0}
    _write(tmp_path, 0, recorder)
    _write(tmp_path, 1)
    _, finding = _behind(tmp_path)
    assert "as it told rank 0's hang warning (it left no dump)" in finding.text
    assert finding.text.endswith(f"; {WHERE}")

"""Full dumps of a 4-rank job (2000 operations each) load and analyze; the
figure of how fast is in docs/debugging.md, this test checks the answer."""

from __future__ import annotations

from pathlib import Path

from asyncdist.flight.descriptions import describe
from asyncdist.flight.dumps import Dumps
from asyncdist.flight.recorder import Recorder
from asyncdist.trace.analyze import analyze
from asyncdist.trace.load import load

CALLS = 2500
BEHIND = 3

ALL_REDUCE = describe("all_reduce", reduce="sum", dtype="float32", shape=(1024,))


def _dump(rank: int, folder: Path) -> None:
    """Rank ``BEHIND`` stops after call CALLS - 1; the others wait in call CALLS."""
    recorder = Recorder(rank, capacity=2000)
    last = CALLS - 1 if rank == BEHIND else CALLS
    for seq in range(1, last + 1):
        entry = recorder.ring.open("collective", 1, "world", seq, ALL_REDUCE, (0, 1, 2, 3), None,
                              recorder.clock())
        if seq < CALLS:
            assert entry is not None
            recorder.close(entry)
    Dumps(recorder, world_size=4, job_id="scale", directory=str(folder)).write(folder)


def test_four_full_dumps_analyze_and_name_the_rank_behind(tmp_path: Path) -> None:
    for rank in range(4):
        _dump(rank, tmp_path)
    trace = load(tmp_path)
    assert all(len(dump.entries) == 2000 for dump in trace.dumps.values())
    findings = analyze(trace)
    behind = [f for f in findings if f.kind == "behind"]
    assert [(f.ranks, f.group, f.call, f.details["waiting"]) for f in behind] == [([BEHIND], "world", CALLS, [0, 1, 2])]
    assert not [f for f in findings if f.kind in ("mismatch", "died")]

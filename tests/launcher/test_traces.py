"""The cause the launcher names from the dumps' findings (asyncdist.launcher.traces.cause).

Findings are built here as asyncdist-trace's analysis makes them; which one
is the cause, and its words, are checked against what each case was built
to say. The launcher's end-to-end summary is tested in test_run.py.
"""

from __future__ import annotations

from asyncdist.launcher.traces import cause
from asyncdist.trace.analyze import Finding

NO_DUMP = Finding("died", "rank 3 left no dump (it died, or could not write one)", [3])
BEHIND = Finding("behind", "rank 3 is behind on group world: it is at all_reduce #4 ...", [3], "world", 5)
MISMATCH = Finding("mismatch", "ranks disagree in call #2 of group world (different size): ...", [0, 1], "world", 2)


def _died(rank: int) -> Finding:
    return Finding("died", f"rank {rank} died: rank {rank} closed the connection", [rank],
                   details={"report": f"rank {rank} closed the connection"})


def _waiting(rank: int, dead: int, call: int) -> Finding:
    return Finding("waiting", f"rank {rank} was waiting ...", [rank], "world", call,
                   {"waiting_for": [dead], "desc": "all_reduce(sum, float32[4])", "error": None})


def test_a_dead_rank_is_named_with_the_call_its_survivors_waited_in() -> None:
    findings = [_died(2), BEHIND, _waiting(0, 2, 7), _waiting(1, 2, 7), _waiting(3, 1, 9)]
    assert cause(findings) == ("rank 2 died: rank 2 closed the connection; ranks [0, 1] waited for it in call "
                                      "#7 of group world (all_reduce(sum, float32[4]))")


def test_of_several_dead_ranks_the_first_to_fail_is_named() -> None:
    findings = [_died(1), _died(2)]
    assert cause(findings, first_failed=2) == "rank 2 died: rank 2 closed the connection"
    assert cause(findings, first_failed=0) == "rank 1 died: rank 1 closed the connection"
    assert cause(findings) == "rank 1 died: rank 1 closed the connection"


def test_a_rank_that_only_left_no_dump_is_no_cause_but_the_rank_behind_is() -> None:
    assert cause([NO_DUMP, BEHIND, _waiting(0, 3, 5)], first_failed=0) == BEHIND.text
    assert cause([NO_DUMP, MISMATCH, BEHIND]) == MISMATCH.text
    assert cause([NO_DUMP, _waiting(0, 3, 5)]) is None
    assert cause([Finding("ok", "no rank is behind, none disagrees and none died (4 of 4 ranks dumped)")]) \
        is None

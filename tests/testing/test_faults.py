"""Fault plans as data: the text form, its round trip, refusals, and plans drawn from a seed."""

from __future__ import annotations

import pytest
from hypothesis import given

from asyncdist.errors import InvalidArgumentError
from asyncdist.testing.faults import (
    KINDS, Cut, Delay, FaultPlan, Kill, Partition, Pause, Refuse, Slow, Trigger, plans,
)  # fmt: skip

EVERY_KIND = (
    "seed 7; kill 2 at all_reduce#3; pause 1 at any#2 for 1.5s; delay 0-1 5ms; delay * 2ms~3ms; "
    "slow 0-1 10MB/s; cut 1-3 after 200ms for 2s; cut 0-1 at barrier#2 for 3s; "
    "partition 0,1|2,3 at all_reduce#1 for 250ms; refuse 2"
)


def test_a_plan_reads_as_its_faults() -> None:
    plan = FaultPlan.parse(EVERY_KIND)
    assert plan == FaultPlan((
        Kill(2, Trigger("all_reduce", 3)),
        Pause(1, Trigger("any", 2), 1.5),
        Delay((0, 1), 0.005),
        Delay(None, 0.002, 0.003),
        Slow((0, 1), 10e6),
        Cut((1, 3), 2.0, after=0.2),
        Cut((0, 1), 3.0, at=Trigger("barrier", 2)),
        Partition(((0, 1), (2, 3)), 0.25, at=Trigger("all_reduce", 1)),
        Refuse(2),
    ), seed=7)  # fmt: skip
    assert str(plan) == EVERY_KIND
    assert plan.kills == {2}


def test_a_link_is_written_lower_rank_first_and_spaces_do_not_matter() -> None:
    plan = FaultPlan.parse("  delay 3-1   1ms ;; kill 0 at send#10 ")
    assert plan.faults == (Delay((1, 3), 0.001), Kill(0, Trigger("send", 10)))
    assert str(plan) == "delay 1-3 1ms; kill 0 at send#10"
    assert FaultPlan.parse("") == FaultPlan() and not FaultPlan.parse("")


@pytest.mark.parametrize("text, why", [
    ("explode 2", "not a fault"),
    ("kill two at all_reduce#3", "invalid literal"),
    ("kill 2 at all_reduce#0", "not an operation"),
    ("kill 2 at all_reduce", "not an operation"),
    ("pause 1 at any#2", "cannot read"),
    ("delay 1-1 5ms", "itself"),
    ("delay 0-1 5 ms", "cannot read"),
    ("delay 0-1 -5ms", "duration"),
    ("slow 0-1 fast", "rate"),
    ("cut * for 1s", "invalid literal"),
    ("cut 0-1 during 1s", "expected 'for T'"),
    ("partition 0,1 for 1s", "two or more sets"),
    ("partition 0,1|1,2 for 1s", "two or more sets"),
    ("kill -1 at any#1", "negative"),
])  # fmt: skip
def test_a_clause_that_is_no_fault_is_refused_by_name(text: str, why: str) -> None:
    with pytest.raises(InvalidArgumentError, match=why) as info:
        FaultPlan.parse(f"seed 1; {text}")
    assert repr(text) in str(info.value)


def test_the_same_seed_draws_the_same_plan_and_others_differ() -> None:
    kinds = tuple(KINDS)
    drawn = [FaultPlan.random(seed, 4, kinds, count=3) for seed in range(40)]
    assert drawn == [FaultPlan.random(seed, 4, kinds, count=3) for seed in range(40)]
    assert len({str(p) for p in drawn}) == 40
    assert {type(f).__name__.lower() for p in drawn for f in p.faults} == set(KINDS)
    assert all(p.seed == seed and len(p.faults) == 3 for seed, p in enumerate(drawn))


def test_a_random_plan_spares_rank_0_and_keeps_to_its_kinds_and_ops() -> None:
    for seed in range(100):
        plan = FaultPlan.random(seed, 3, ["kill", "pause"], ops=["all_reduce"], max_count=4)
        (fault,) = plan.faults
        assert isinstance(fault, (Kill, Pause)) and fault.rank in (1, 2)
        assert fault.at.op == "all_reduce" and 1 <= fault.at.count <= 4


def test_random_refuses_unknown_kinds_and_a_world_of_one() -> None:
    with pytest.raises(InvalidArgumentError, match="among"):
        FaultPlan.random(0, 4, ["kill", "meteor"])
    with pytest.raises(InvalidArgumentError, match="at least 2 ranks"):
        FaultPlan.random(0, 1)


@given(plans(5, tuple(KINDS), count=4, ops=("all_reduce", "send", "any")))
def test_every_drawn_plan_reads_back_as_itself(plan: FaultPlan) -> None:
    assert FaultPlan.parse(str(plan)) == plan
    assert str(FaultPlan.parse(str(plan))) == str(plan)

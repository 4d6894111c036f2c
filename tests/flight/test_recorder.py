"""The flight recorder, over either ring (C and Python), its switches and the
reading of descriptions (no loop, no sockets)."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from asyncdist.flight.counters import Counters
from asyncdist.flight.descriptions import Description, describe, describe_message, short
from asyncdist.flight.recorder import Recorder, as_dict, capacity_from_env, state_of
from asyncdist.flight.record_ring import ENDED_AT, ERROR, POSTED_AT, SEQ, SERIAL, Entry
from asyncdist.flight.whereabouts import hang_warn_from_env
from asyncdist.errors import InvalidArgumentError

@pytest.fixture
def make(ring_type: type) -> Callable[..., Recorder]:
    """A recorder over each kind of ring."""
    return lambda rank=0, capacity=8, ops=None: Recorder(rank, capacity, ops, ring=ring_type)


ALL_REDUCE = describe("all_reduce", reduce="sum", dtype="float32", shape=(4,))
BROADCAST = describe("broadcast", root=0, dtype="int8", shape=(2,))
BARRIER = describe("barrier")


def _record(recorder: Recorder, seq: int, desc: Description = ALL_REDUCE) -> Any:
    handle = recorder.ring.open("collective", 1, "world", seq, desc, (0, 1), None, recorder.clock())
    assert handle is not None
    return handle


def _kept(recorder: Recorder, seq: int) -> Entry:
    """The record of call ``seq`` as the recorder gives it now."""
    entry, = (e for e in recorder.entries() if e[SEQ] == seq)
    return entry


def test_the_ring_wraps_and_keeps_the_newest_n(make: Callable[..., Recorder]) -> None:
    recorder = make(capacity=5)
    for seq in range(12):
        recorder.close(_record(recorder, seq))
    assert [e[SEQ] for e in recorder.entries()] == [7, 8, 9, 10, 11]
    assert [e[SERIAL] for e in recorder.entries()] == [7, 8, 9, 10, 11]
    assert recorder.recorded == 12


def test_an_open_operation_the_ring_wraps_over_still_ends_once(make: Callable[..., Recorder]) -> None:
    recorder = make(capacity=2)
    first = _record(recorder, 1)
    assert state_of(_kept(recorder, 1)) == "posted"
    for seq in (2, 3):
        recorder.close(_record(recorder, seq))
    assert [e[SEQ] for e in recorder.entries()] == [2, 3]
    assert recorder.close(first, InvalidArgumentError("bad")) is True
    assert recorder.close(first) is False
    assert [e[SEQ] for e in recorder.entries()] == [2, 3]
    assert recorder.ops[1][ALL_REDUCE][0] == 3


def test_an_operation_ends_once(make: Callable[..., Recorder]) -> None:
    recorder = make()
    handle = _record(recorder, 1)
    assert recorder.close(handle) is True
    ended = _kept(recorder, 1)[ENDED_AT]
    assert recorder.close(handle, InvalidArgumentError("late")) is False
    assert (_kept(recorder, 1)[ENDED_AT], _kept(recorder, 1)[ERROR]) == (ended, None)
    assert recorder.ops[1][ALL_REDUCE][0] == 1


def test_operations_are_counted_by_description_as_they_end(make: Callable[..., Recorder]) -> None:
    recorder = make(capacity=4)
    handles = [_record(recorder, seq) for seq in range(4)]
    assert recorder.ops[1][ALL_REDUCE] == [0, 0.0]  # none ended yet
    for handle in handles:
        recorder.close(handle)
    assert list(recorder.ops) == [1]
    (count, seconds), = recorder.ops[1].values()
    entries = recorder.entries()
    assert count == 4 and seconds == pytest.approx(sum(e[ENDED_AT] - e[POSTED_AT] for e in entries), abs=1e-9)


def test_an_operation_the_ring_wrapped_over_while_open_is_counted_when_it_ends(make: Callable[..., Recorder]) -> None:
    recorder = make(capacity=4)
    first = _record(recorder, 0, BARRIER)
    posted = _kept(recorder, 0)[POSTED_AT]
    seconds = 0.0
    for seq in range(1, 10):  # the ring wraps over the open one
        desc = BROADCAST if seq % 3 == 0 else ALL_REDUCE
        recorder.close(_record(recorder, seq, desc))
        entry = _kept(recorder, seq)
        seconds += entry[ENDED_AT] - entry[POSTED_AT] if desc is ALL_REDUCE else 0.0
    assert recorder.ops[1][ALL_REDUCE][0] == 6
    assert recorder.ops[1][BROADCAST][0] == 3
    assert recorder.ops[1][BARRIER] == [0, 0.0]
    before = recorder.clock()
    recorder.close(first)
    count, waited = recorder.ops[1][BARRIER]
    assert count == 1 and before - posted <= waited <= recorder.clock() - posted
    assert recorder.ops[1][ALL_REDUCE][0] == 6
    assert recorder.ops[1][ALL_REDUCE][1] == pytest.approx(seconds, abs=1e-9)


def test_groups_that_make_the_same_call_in_turn_are_counted_apart(make: Callable[..., Recorder]) -> None:
    recorder = make()
    for seq in range(5):
        for ctx in (1, 3, 3):
            handle = recorder.ring.open("collective", ctx, f"g{ctx}", seq, BARRIER, (0, 1), None, recorder.clock())
            assert handle is not None
            recorder.close(handle)
    assert (recorder.ops[1][BARRIER][0], recorder.ops[3][BARRIER][0]) == (5, 10)


def test_capacity_zero_records_nothing(make: Callable[..., Recorder]) -> None:
    recorder = make(capacity=0)
    assert recorder.ring.open("collective", 1, "world", 1, BARRIER, (0, 1), None, 0.0) is None
    assert recorder.entries() == [] and recorder.where(1) is None and recorder.recorded == 0


def test_where_answers_with_the_latest_operation_of_the_context(make: Callable[..., Recorder]) -> None:
    recorder = make(rank=3)
    recorder.close(_record(recorder, 55))
    _record(recorder, 56, describe("broadcast", root=1, dtype="float32", shape=(4,)))
    recorder.ring.open("p2p", 0, "world", 0, describe_message("send", 1, 0, "world"), (1,), None, recorder.clock())
    answer = recorder.where(1)
    assert answer is not None
    assert (answer["seq"], answer["desc"], answer["state"]) == (56, "broadcast(src=1, float32[4])", "posted")
    described = Description.from_dict(answer["described"], answer["desc"])
    assert short(described, answer["seq"], answer["group"]) == "broadcast #56 (root 1) on group world"


@pytest.mark.parametrize(("text", "expected"), [("", 2000), ("0", 0), (" 17 ", 17)])
def test_capacity_from_the_environment(text: str, expected: int) -> None:
    assert capacity_from_env({"ASYNCDIST_TRACE_BUFFER": text}) == expected


@pytest.mark.parametrize("text", ["-1", "many", "1.5"])
def test_a_bad_capacity_is_refused(text: str) -> None:
    with pytest.raises(InvalidArgumentError, match="ASYNCDIST_TRACE_BUFFER"):
        capacity_from_env({"ASYNCDIST_TRACE_BUFFER": text})


def test_hang_warn_from_the_environment() -> None:
    assert hang_warn_from_env({}) == 60.0
    assert hang_warn_from_env({"ASYNCDIST_HANG_WARN": "0.5"}) == 0.5
    for bad in ("-2", "soon", "inf"):
        with pytest.raises(InvalidArgumentError, match="ASYNCDIST_HANG_WARN"):
            hang_warn_from_env({"ASYNCDIST_HANG_WARN": bad})


# The texts are the wire's: ranks of other versions compare them for the mismatch check.
@pytest.mark.parametrize(("described", "text", "nbytes"), [
    (describe("all_reduce", reduce="sum", dtype="float32", shape=(4,)), "all_reduce(sum, float32[4])", 16),
    (describe("reduce", root=2, reduce="max", dtype="int64", shape=(3, 2)), "reduce(dst=2, max, int64[3, 2])", 48),
    (describe("broadcast", root=1, dtype="bfloat16", shape=(8,)), "broadcast(src=1, bfloat16[8])", 16),
    (describe("scatter", root=0, dtype="uint8", shape=(3,)), "scatter(src=0, uint8[3])", 3),
    (describe("gather", root=1, dtype="int8", shape=()), "gather(dst=1, int8[])", 1),
    (describe("reduce_scatter", reduce="sum", dtype="float64", shape=(5,), per_rank=True),
     "reduce_scatter(sum, float64[5] per rank)", 40),
    (describe("all_to_all", dtype="float32"), "all_to_all(float32)", None),
    (describe("barrier"), "barrier", None),
    (describe_message("send", 1, 7, "world", 12), "send to rank 1 (tag 7, group 'world')", 12),
    (describe_message("recv", None, -3, "g"), "recv from any rank (tag -3, group 'g')", None),
])  # fmt: skip
def test_descriptions_say_their_parts_and_their_text(described: Description, text: str, nbytes: int | None) -> None:
    assert (described.text, described.nbytes) == (text, nbytes)
    assert Description.from_dict(described.as_dict(), text) == described  # as a dump reads it back
    assert described.is_message == text.startswith(("send", "recv"))


def test_a_description_is_made_once_per_kind_of_call() -> None:
    """The hot path builds nothing: the same call gets the same object (the ring then compares nothing)."""
    first = describe("all_reduce", reduce="sum", dtype="float32", shape=(4,))
    assert describe("all_reduce", reduce="sum", dtype="float32", shape=(4,)) is first
    assert describe("all_reduce", reduce="max", dtype="float32", shape=(4,)) != first


def test_the_state_is_derived_from_the_times_and_the_error(make: Callable[..., Recorder]) -> None:
    recorder = make()
    handle = _record(recorder, 1)
    entry = _kept(recorder, 1)
    assert (state_of(entry), as_dict(entry)["state"], as_dict(entry)["started"]) == ("posted", "posted", None)
    recorder.ring.start(handle)  # what a channel does as its call starts
    assert as_dict(_kept(recorder, 1))["state"] == "started"
    recorder.close(handle)
    dumped = as_dict(_kept(recorder, 1))
    assert dumped["state"] == "completed" and dumped["posted"] <= dumped["started"] <= dumped["ended"]
    recorder.close(_record(recorder, 2), InvalidArgumentError("bad"))
    failed = as_dict(_kept(recorder, 2))
    assert (failed["state"], failed["error"]) == ("failed", "InvalidArgumentError: bad")


def test_a_reset_zeroes_the_counts_and_an_operation_open_across_it_counts_after(
    make: Callable[..., Recorder]
) -> None:
    counters = Counters(world_size=2)
    recorder = make(ops=counters.ops)
    recorder.close(_record(recorder, 1))
    still_open = _record(recorder, 2)
    counters.reset()
    assert counters.snapshot([1], [1], lambda rank: True)["ops"] == {}
    recorder.close(still_open)
    recorder.close(_record(recorder, 3, BARRIER))
    ops = counters.snapshot([1], [1], lambda rank: True)["ops"]
    assert {op: stat["count"] for op, stat in ops.items()} == {"all_reduce": 1, "barrier": 1}
    entry = _kept(recorder, 2)
    assert ops["all_reduce"]["seconds"] == pytest.approx(entry[ENDED_AT] - entry[POSTED_AT], abs=1e-9)

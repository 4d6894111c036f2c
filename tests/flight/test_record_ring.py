"""The flight recorder's two rings: the C one records what the Python one does,
frees what it holds, and refuses bad arguments (no loop, no sockets)."""

from __future__ import annotations

import gc
import random
import sys
import time
import weakref
from typing import Any

import pytest

from asyncdist.engine.progress import Awaited
from asyncdist.flight.recorder import Recorder, as_dict
from asyncdist.flight.descriptions import describe_message
from asyncdist.flight.record_ring import (
    AWAITED, ENDED_AT, FIELDS, NATIVE, POSTED_AT, SEQ, STARTED_AT, STEP, Entry, PyRecordRing, RecordRing,
)  # fmt: skip
from asyncdist.errors import InvalidArgumentError

native_only = pytest.mark.skipif(not NATIVE, reason="the C ring was not built")

_TIMES = (POSTED_AT, STARTED_AT, ENDED_AT)


def _play(ring_type: type, seed: int) -> tuple[list[Entry], dict, list[bool]]:
    """A random run of operations (opens, starts, ends, failures, the ring
    wrapping over open ones) on a ring of ``ring_type``: its entries with each
    time as whether it is set, its counts, and what each end returned."""
    rng = random.Random(seed)
    ops: dict[int, dict[str, list]] = {}
    recorder = Recorder(0, 7, ops, ring=ring_type)
    open_handles: list[Any] = []
    ended: list[bool] = []
    for seq in range(300):
        action = rng.random()
        if action < 0.45 or not open_handles:
            ctx = rng.choice((1, 3))
            desc = rng.choice(("barrier", "all_reduce(sum, float32[4])", "broadcast(src=1, int8[2])"))
            started = rng.choice((None, 5.0))
            handle = recorder.ring.open(rng.choice(("collective", "p2p")), ctx, f"g{ctx}", seq, desc, (0, seq % 4),
                                   None, 1.0, started, rng.randrange(-1, 100))  # fmt: skip
            open_handles.append(handle)
        elif action < 0.55:
            recorder.ring.start(rng.choice(open_handles))
        else:
            handle = open_handles.pop(rng.randrange(len(open_handles)))
            error = InvalidArgumentError(f"bad {seq}") if rng.random() < 0.2 else None
            ended.append(recorder.close(handle, error))
            if rng.random() < 0.1:
                ended.append(recorder.close(handle))  # twice: no effect
    entries = [[(e[i] is not None) if i in _TIMES else e[i] for i in range(len(FIELDS))] for e in recorder.entries()]
    counts = {ctx: {desc: count for desc, (count, _) in by_desc.items()} for ctx, by_desc in ops.items()}
    return entries, counts, ended


@native_only
@pytest.mark.parametrize("seed", range(20))
def test_the_c_ring_records_what_the_python_ring_does(seed: int) -> None:
    assert _play(RecordRing, seed) == _play(PyRecordRing, seed)


def test_an_entry_is_a_snapshot_with_every_field(ring_type: type) -> None:
    ring = ring_type(4, {})
    step = object()
    send = describe_message("send", 1, 0, "world")
    handle = ring.open("p2p", 2, "world", 0, send, (1,), step, 1.5, 2.5, 64)
    entry, = ring.entries()
    assert dict(zip(FIELDS, entry)) == {
        "serial": 0, "kind": "p2p", "ctx": 2, "group": "world", "seq": 0,
        "desc": send, "peers": (1,), "step": step, "dtype": None, "shape": None,
        "nbytes": 64, "posted": 1.5, "started": 2.5, "ended": None, "error": None, "awaited": None,
    }  # fmt: skip
    entry[SEQ] = 99  # a copy: the ring keeps its own
    assert ring.entries()[0][SEQ] == 0
    assert ring.end(handle, "OperationTimeoutError: late") is True
    entry, = ring.entries()
    assert (entry[STEP], entry[ENDED_AT] > entry[POSTED_AT], as_dict(entry)["state"]) == (None, True, "failed")
    assert (as_dict(entry)["desc"], as_dict(entry)["described"]["tag"]) == (send.text, 0)


def test_the_times_are_read_from_the_loops_clock(ring_type: type) -> None:
    ring = ring_type(2, {})
    before = time.monotonic()
    handle = ring.open("collective", 1, "world", 1, "barrier", (0, 1), None, before)
    ring.start(handle)
    ring.end(handle)
    after = time.monotonic()
    entry, = ring.entries()
    assert before == entry[POSTED_AT] <= entry[STARTED_AT] <= entry[ENDED_AT] <= after


def test_a_failure_freezes_what_each_open_operation_waits_on(ring_type: type) -> None:
    class Step:
        def awaited(self) -> Awaited:
            return Awaited(receiving=(1,), sending=(2,), members=(0, 4, 6))

    recorder = Recorder(0, 4, ring=ring_type)
    recorder.close(recorder.ring.open("collective", 1, "world", 1, "barrier", (0, 4, 6), Step(), 0.0))
    recorder.ring.open("collective", 1, "world", 2, "barrier", (0, 4, 6), Step(), 0.0)
    assert recorder.awaits(4) and recorder.awaits(6) and not recorder.awaits(0)
    recorder.freeze()
    done, waiting = recorder.entries()
    assert (done[AWAITED], waiting[AWAITED]) == (None, {"receiving": [4], "sending": [6]})


def test_a_cycle_through_an_open_record_is_collected(ring_type: type) -> None:
    """An open record holds its step (a channel, which holds the engine and so
    the recorder): the garbage collector must see through the ring."""

    class Step:
        recorder: Recorder

    recorder = Recorder(0, 4, ring=ring_type)
    step = Step()
    step.recorder = recorder
    recorder.ring.open("collective", 1, "world", 1, "barrier", (0, 1), step, 0.0)
    gone = weakref.ref(step)
    del step, recorder
    gc.collect()
    assert gone() is None


def test_a_ring_lets_go_of_everything_it_held(ring_type: type) -> None:
    """Wrapping many times, failing, ending twice and being freed, a ring
    leaves every object it was handed with the references it had before."""
    kind, group, desc, peers, error = "collective", "g" * 3, "all_reduce(sum, float32[4])" * 2, (0, 1), "E: e" * 2
    step = object()
    held = [kind, group, desc, peers, step, error]
    before = [sys.getrefcount(obj) for obj in held]
    ring = ring_type(5, {})
    for seq in range(200):
        handle = ring.open(kind, 1, group, seq, desc, peers, step, 0.0)
        if seq % 7:  # the others stay open as the ring wraps over them
            ring.start(handle)
            ring.end(handle, error if seq % 3 == 0 else None)
            ring.end(handle, error)
        ring.note_awaited(seq, {"receiving": [1], "sending": []})
    assert ring.recorded == 200 and len(ring.entries()) == 5
    del ring, handle
    assert [sys.getrefcount(obj) for obj in held] == before


@native_only
def test_the_c_ring_refuses_bad_arguments() -> None:
    ring = RecordRing(4, {})
    with pytest.raises(TypeError, match="from 8 to 10 positional arguments"):
        ring.open("collective", 1, "world", 1, "barrier")
    with pytest.raises(TypeError):
        ring.open("collective", "one", "world", 1, "barrier", (0, 1), None, 0.0)
    with pytest.raises(ValueError, match="capacity must be >= 0"):
        RecordRing(-1, {})
    with pytest.raises(TypeError):
        RecordRing(4, [])
    assert ring.recorded == 0 and ring.entries() == []
    assert ring.end(123) is False  # never opened: nothing to end

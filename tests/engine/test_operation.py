"""The Operation alone: what it waits on, its deadline and hang warning, its record.

An Operation is driven here by a fake engine (a real flight recorder, a
``send`` that records its headers), on a real event loop; multi-rank
behaviour is covered by the group and reliability tests.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from asyncdist.buffers.host import as_host_buffer
from asyncdist.engine.deadlines import Deadlines
from asyncdist.engine.operation import Operation
from asyncdist.engine.progress import Awaited
from asyncdist.errors import OperationTimeoutError
from asyncdist.flight import Flight
from asyncdist.flight.descriptions import Description, describe, describe_message
from asyncdist.flight.recorder import as_dict
from asyncdist.wire.frames import Header, Kind
from asyncdist.wire.handshake import Identity


class FakeEngine:
    """An OperationHost: rank 3 of 6, with a real flight recorder; sends are kept."""

    def __init__(self, hang_warn: float = 0.0) -> None:
        self.rank = 3
        self.flight = Flight(Identity("job", 3, 6, b"secret"), {})
        self.flight.hang_warn = hang_warn
        self.deadlines = Deadlines()
        self.sent: list[tuple[int, Header, bytes]] = []
        self.warnings: list[tuple[Any, ...]] = []
        self.warned = asyncio.Event()
        self.flight.whereabouts.warn = self._warn  # type: ignore[method-assign]

    def _warn(self, *args: Any) -> None:
        self.warnings.append(args)
        self.warned.set()

    def send(self, dst: int, header: Header, payload: memoryview | None) -> asyncio.Future | None:
        self.sent.append((dst, header, bytes(payload or b"")))
        return None


MEMBERS = (5, 3, 0)  # group rank -> global rank; this rank is group rank 1


def _message(engine: FakeEngine, description: Description, peers: tuple[int, ...]) -> Operation:
    """A point-to-point message of context 4 waiting on group ranks ``peers``, as the group's p2p opens one."""
    return Operation(engine, "p2p", 4, 0, description, description.group or "", MEMBERS, 30.0,
                     tuple(MEMBERS[p] for p in peers), started=True)


def _entries(engine: FakeEngine) -> list[dict[str, Any]]:
    return [as_dict(entry) for entry in engine.flight.recorder.entries()]


async def test_a_message_waits_on_its_peer_until_its_future_is_done() -> None:
    engine = FakeEngine()
    description = describe_message("recv", None, 7, "g", 16)
    operation = _message(engine, description, (0, 2))
    future = asyncio.get_running_loop().create_future()
    operation.follow(future, (0, 2), sending=False)
    assert operation.where == "recv from any rank (tag 7, group 'g')"
    assert operation.is_open() and operation.awaited() == Awaited(receiving=(0, 2), members=MEMBERS)
    entry, = _entries(engine)
    assert (entry["kind"], entry["ctx"], entry["seq"], entry["peers"], entry["nbytes"], entry["state"]) == (
        "p2p", 4, 0, [5, 0], 16, "started")
    assert entry["desc"] == description.text and entry["described"]["tag"] == 7

    future.set_result(None)
    await asyncio.sleep(0)  # the done-callbacks run on the loop's next turn
    assert not operation.is_open() and not operation.awaited()
    assert _entries(engine)[0]["state"] == "completed"


async def test_a_message_sends_its_payload_under_the_users_tag() -> None:
    engine = FakeEngine()
    operation = _message(engine, describe_message("send", 0, -2, "g"), (0,))
    payload = np.arange(3, dtype=np.int16)
    assert operation.send_payload(5, -2, as_host_buffer(payload)) is None
    (dst, header, sent), = engine.sent
    assert dst == 5 and sent == payload.tobytes()
    assert (header.kind, header.ctx, header.src, header.tag, header.seq) == (Kind.DATA, 4, 3, -2, 0)
    assert (header.dtype, header.shape, header.nbytes, header.op) == ("int16", (3,), 6, "")


async def test_the_deadline_fails_the_wait_naming_the_call_and_its_peers() -> None:
    engine = FakeEngine()
    description = describe("all_reduce", reduce="sum", dtype="float32", shape=(4,))
    operation = Operation(engine, "collective", 2, 9, description, "world", MEMBERS, 0.05, MEMBERS)
    future = asyncio.get_running_loop().create_future()
    withdrawn: list[bool] = []
    with pytest.raises(OperationTimeoutError) as caught:
        await operation.awaiting(future, lambda: withdrawn.append(True), (0, 2))
    assert str(caught.value) == (
        "rank 3: all_reduce(sum, float32[4]) (call #9 in group 'world') Timed out after 0.05 s; "
        "still waiting for ranks [0, 2] (global [5, 0])"
    )
    assert withdrawn == [True]
    assert operation.close(caught.value, dump=False) and not operation.close()  # a record ends once
    assert _entries(engine)[0]["state"] == "failed"


async def test_the_hang_warning_comes_once_before_the_deadline() -> None:
    engine = FakeEngine(hang_warn=0.01)
    description = describe("broadcast", root=0, dtype="uint8", shape=(1,))
    operation = Operation(engine, "collective", 2, 4, description, "world", MEMBERS, 5.0, MEMBERS)
    future = asyncio.get_running_loop().create_future()
    operation.awaiting(future, None, (0,))
    await engine.warned.wait()  # set by the rank's one timer
    ctx, seq, described, group, members, awaited, _since = engine.warnings[0]
    assert (ctx, seq, described, group, members, awaited) == (2, 4, description, "world", [5, 0], [5])
    assert engine.deadlines.next_at == operation.deadline  # armed again, for the deadline
    future.set_result(None)
    assert not future.cancelled() and len(engine.warnings) == 1
    assert operation.close() and _entries(engine)[0]["state"] == "completed"
    assert operation not in engine.deadlines.open


async def test_one_timer_serves_every_operation_and_fires_for_the_earliest() -> None:
    engine = FakeEngine()
    description = describe("barrier")
    slow = Operation(engine, "collective", 2, 1, description, "world", MEMBERS, 30.0, MEMBERS)
    armed_at = engine.deadlines.next_at
    assert armed_at == slow.deadline
    for seq in range(2, 50):  # later operations with the same timeout leave the timer alone
        Operation(engine, "collective", 2, seq, description, "world", MEMBERS, 30.0, MEMBERS).close()
    assert engine.deadlines.next_at == armed_at and list(engine.deadlines.open) == [slow]
    fast = Operation(engine, "collective", 2, 50, description, "world", MEMBERS, 0.02, MEMBERS)
    assert engine.deadlines.next_at == fast.deadline  # sooner: the timer is armed again
    future = asyncio.get_running_loop().create_future()
    with pytest.raises(OperationTimeoutError, match="call #50"):
        await fast.awaiting(future, None, (1,))
    assert list(engine.deadlines.open) == [slow] and engine.deadlines.next_at == slow.deadline
    assert slow.close() and not engine.deadlines.open


async def test_a_deadline_before_the_hang_warning_fires_first() -> None:
    engine = FakeEngine(hang_warn=60.0)
    operation = Operation(engine, "collective", 2, 5, describe("barrier"), "world", MEMBERS, 0.02, MEMBERS)
    assert engine.deadlines.next_at == operation.deadline
    future = asyncio.get_running_loop().create_future()
    with pytest.raises(OperationTimeoutError, match="Timed out after 0.02 s"):
        await asyncio.wait_for(operation.awaiting(future, None, (0,)), 5.0)  # not at the warning, 60 s on
    assert not engine.warnings


async def test_the_deadline_waits_for_the_next_wait_when_nothing_is_awaited() -> None:
    engine = FakeEngine()
    operation = Operation(engine, "collective", 2, 3, describe("barrier"), "world", MEMBERS, 0.01, MEMBERS)
    await asyncio.sleep(0.02)  # the deadline passes while the operation awaits nothing of its own
    assert operation in engine.deadlines.open
    future = asyncio.get_running_loop().create_future()
    with pytest.raises(OperationTimeoutError, match="call #3"):
        await operation.awaiting(future, None, (0,))


async def test_a_watched_future_that_is_cancelled_withdraws_what_it_posted() -> None:
    engine = FakeEngine()
    operation = _message(engine, describe_message("recv", 0, 1, "g"), (0,))
    future = asyncio.get_running_loop().create_future()
    operation.follow(future, (0,), sending=False)
    withdrawn: list[bool] = []
    operation.watch(future, lambda: withdrawn.append(True))
    future.cancel()
    await asyncio.sleep(0)
    assert withdrawn == [True]
    entry, = _entries(engine)
    assert entry["state"] == "failed" and "cancelled" in entry["error"]

"""The private parts of asyncio that ``asyncdist.loop.asyncio_internals`` relies on
are still there and still behave as it says, on asyncio's loop and on uvloop.

A failure here names the internal and the Python version: a new Python (or
uvloop) changed something that the blocking facade's fast path needs, and
``asyncdist/loop/asyncio_internals.py`` must be updated for it.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Callable, Iterator

import pytest

from asyncdist.loop import asyncio_internals as internals
from asyncdist.loop.turns import Driver

try:
    import uvloop
except ImportError:  # uvloop is Linux-only
    uvloop = None

PYTHON = f"Python {sys.version.split()[0]}"

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {"asyncio": asyncio.new_event_loop}
if uvloop is not None:
    LOOPS["uvloop"] = uvloop.new_event_loop


def _broken(what: str) -> str:
    return f"asyncio internal {what} changed on {PYTHON}: update asyncdist/loop/asyncio_internals.py"


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(params=sorted(LOOPS))
def any_loop(request: pytest.FixtureRequest) -> Iterator[asyncio.AbstractEventLoop]:
    loop = LOOPS[request.param]()
    yield loop
    loop.close()


def test_asyncio_s_loop_has_every_internal_the_driver_turns_it_with(loop: asyncio.AbstractEventLoop) -> None:
    assert isinstance(loop, asyncio.BaseEventLoop), _broken("BaseEventLoop (the default loop's class)")
    assert not internals.missing(loop), _broken(f"BaseEventLoop.{', '.join(internals.missing(loop))} (missing)")
    assert callable(loop._run_once), _broken("BaseEventLoop._run_once (not a method)")  # type: ignore[attr-defined]
    assert loop._stopping is False, _broken("BaseEventLoop._stopping (not False on a new loop)")  # type: ignore[attr-defined]
    assert loop._thread_id is None, _broken("BaseEventLoop._thread_id (not None on a new loop)")  # type: ignore[attr-defined]
    assert internals.can_step(loop) and Driver(loop)._steps, "the blocking facade lost its fast path on " + PYTHON


def test_running_loop_accessors_are_asyncio_s_own(any_loop: asyncio.AbstractEventLoop) -> None:
    for name in ("_get_running_loop", "_set_running_loop"):
        assert name in asyncio.events.__all__, _broken(f"asyncio.events.{name} (no longer exported)")
    assert internals.running_loop_or_none() is None, _broken("asyncio.events._get_running_loop (not None outside a loop)")

    async def seen() -> asyncio.AbstractEventLoop | None:
        return internals.running_loop_or_none()

    # uvloop marks its loop running with asyncio's own setter: LoopThread.run's check holds for it too
    assert any_loop.run_until_complete(seen()) is any_loop, _broken("asyncio.events._get_running_loop (inside a loop)")


def test_enter_and_leave_mark_the_loop_running_in_this_thread(loop: asyncio.AbstractEventLoop) -> None:
    internals.enter(loop)
    try:
        assert loop.is_running(), _broken("BaseEventLoop._thread_id (is_running() no longer reads it)")
        assert asyncio.get_running_loop() is loop, _broken("asyncio.events._set_running_loop")
    finally:
        internals.leave(loop)
    assert not loop.is_running(), _broken("BaseEventLoop._thread_id (is_running() after leave)")
    assert internals.running_loop_or_none() is None, _broken("asyncio.events._set_running_loop(None)")


def test_a_turn_runs_the_ready_callbacks_once(loop: asyncio.AbstractEventLoop) -> None:
    ran: list[int] = []
    loop.call_soon(ran.append, 1)
    internals.enter(loop)
    try:
        internals.turn(loop, poll=False)  # something is ready: it does not sleep
    finally:
        internals.leave(loop)
    assert ran == [1], _broken("BaseEventLoop._run_once (did not run a ready callback)")


def test_a_polling_turn_does_not_sleep_and_clears_stop(loop: asyncio.AbstractEventLoop) -> None:
    later = loop.call_later(60, pytest.fail, "a timer 60 s away ran")
    loop.call_soon(loop.stop)  # a stop() made during the turn does not outlive it
    internals.enter(loop)
    started = time.monotonic()
    try:
        internals.turn(loop, poll=True)
        internals.turn(loop, poll=True)  # nothing ready, a timer far away: returns at once
    finally:
        internals.leave(loop)
    later.cancel()
    assert time.monotonic() - started < 30, _broken("BaseEventLoop._stopping (_run_once slept while it was set)")
    assert loop._stopping is False  # type: ignore[attr-defined]


def test_uvloop_runs_blocking_calls_as_tasks() -> None:
    if uvloop is None:
        pytest.skip("uvloop is not installed")
    loop = uvloop.new_event_loop()
    try:
        assert not internals.can_step(loop), "uvloop became an asyncio.BaseEventLoop: review asyncio_internals.can_step"
        driver = Driver(loop)
        assert driver.run(_answer()) == 42
    finally:
        loop.close()


async def _answer() -> int:
    await asyncio.sleep(0)
    return 42

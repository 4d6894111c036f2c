"""Driver: coroutines stepped by the calling thread, as a Task would step it.

Each test runs coroutines with a Driver on a fresh asyncio loop and checks
what a Task would give: the result or the exception, context isolation,
cancellation at the await; and what the Driver saves: the turns of the loop
it needs, counted by wrapping the loop's iteration.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import threading
from typing import Any, Callable, Coroutine, Iterator

import pytest

import os

from asyncdist.loop.turns import Driver
from asyncdist.transport.spinning import DEFAULT_SPIN_SECONDS, spin_seconds

_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("test_drive_var", default="unset")


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _count_turns(loop: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    turns = [0]
    run_once = loop._run_once

    def counted() -> None:
        turns[0] += 1
        run_once()

    monkeypatch.setattr(loop, "_run_once", counted)
    return turns


def test_the_result_comes_back_through_futures_timers_and_bare_yields(loop: asyncio.AbstractEventLoop) -> None:
    async def work(n: int) -> list[int]:
        seen = []
        for i in range(n):
            await asyncio.sleep(0)
            future = loop.create_future()
            loop.call_soon(future.set_result, i * i)
            seen.append(await future)
            await asyncio.sleep(0.001)  # a timer
        return seen

    assert Driver(loop).run(work(5)) == [i * i for i in range(5)]
    assert not loop.is_running() and asyncio._get_running_loop() is None


def test_an_exception_reaches_the_caller_and_the_loop_stays_usable(loop: asyncio.AbstractEventLoop) -> None:
    async def fails() -> None:
        await asyncio.sleep(0)
        raise ValueError("rank 3 disagrees")

    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    driver = Driver(loop)
    with pytest.raises(ValueError, match="rank 3 disagrees"):
        driver.run(fails())
    assert driver.run(answer()) == 42


def test_a_ctrl_c_before_the_first_step_leaves_the_loop_and_closes_the_coroutine(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python raises KeyboardInterrupt between any two bytecodes; one raised as the
    drive marks the loop running (before the signal handler can cancel the call
    instead) must not leave this thread marked as the loop's, or every later
    blocking call, destroy_process_group at exit among them, is refused."""
    from asyncdist.loop import turns

    real_enter = turns.enter

    def enter_then_interrupted(the_loop: Any) -> None:
        real_enter(the_loop)
        raise KeyboardInterrupt

    async def work() -> int:
        return 7

    coro = work()
    monkeypatch.setattr(turns, "enter", enter_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        Driver(loop).run(coro)
    assert asyncio._get_running_loop() is None and not loop.is_running()
    assert inspect.getcoroutinestate(coro) == inspect.CORO_CLOSED  # closed: no "never awaited" warning
    monkeypatch.setattr(turns, "enter", real_enter)
    assert Driver(loop).run(work()) == 7


def test_context_variables_set_by_the_coroutine_stay_in_it(loop: asyncio.AbstractEventLoop) -> None:
    async def sets() -> str:
        before = _VAR.get()
        _VAR.set("inside")
        await asyncio.sleep(0)
        return f"{before}->{_VAR.get()}"

    token = _VAR.set("caller")
    try:
        assert Driver(loop).run(sets()) == "caller->inside"
        assert _VAR.get() == "caller"
    finally:
        _VAR.reset(token)


def test_a_future_completed_in_a_turn_resumes_the_coroutine_without_another(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    turns = _count_turns(loop, monkeypatch)

    async def one_round_trip() -> str:
        future = loop.create_future()
        loop.call_soon(future.set_result, "reply")
        return await future

    async def done_at_once() -> int:
        return 7

    assert Driver(loop).run(done_at_once()) == 7
    assert turns == [0]
    assert Driver(loop).run(one_round_trip()) == "reply"
    assert turns == [1]  # a Task under run_forever needs 3: first step, the reply, its wake-up


async def _awaits_a_future_forever(started: threading.Event) -> str:
    never = asyncio.get_running_loop().create_future()
    started.set()
    try:
        await never
    except asyncio.CancelledError:
        return f"cancelled; future cancelled too: {never.cancelled()}"
    return "not cancelled"


async def _only_yields(started: threading.Event) -> str:
    started.set()
    try:
        while True:
            await asyncio.sleep(0)
    except asyncio.CancelledError:
        return "cancelled while polling"


@pytest.mark.parametrize(
    ("body", "expected"),
    [(_awaits_a_future_forever, "cancelled; future cancelled too: True"), (_only_yields, "cancelled while polling")],
    ids=["awaiting-a-future", "only-yielding"],
)
def test_cancel_from_another_thread_raises_at_the_coroutine_s_await(
    loop: asyncio.AbstractEventLoop, body: Callable[[threading.Event], Coroutine[Any, Any, str]], expected: str
) -> None:
    started = threading.Event()
    driver = Driver(loop)
    canceller = threading.Thread(target=lambda: (started.wait(30), driver.cancel()))
    canceller.start()
    assert driver.run(body(started)) == expected
    canceller.join(30)


def test_a_cancel_while_nothing_runs_does_not_reach_the_next_call(loop: asyncio.AbstractEventLoop) -> None:
    driver = Driver(loop)
    driver.cancel()

    async def waits() -> str:
        future = loop.create_future()
        loop.call_soon(future.set_result, "completed")
        return await future

    assert driver.run(waits()) == "completed"


def test_a_loop_stop_does_not_end_the_drive_early(loop: asyncio.AbstractEventLoop) -> None:
    async def stops_the_loop() -> str:
        loop.stop()
        future = loop.create_future()
        loop.call_later(0.001, future.set_result, "still running")
        return await future

    assert Driver(loop).run(stops_the_loop()) == "still running"
    assert loop._stopping is False  # type: ignore[attr-defined]


def test_a_coroutine_awaiting_another_loop_s_future_gets_a_clear_error(loop: asyncio.AbstractEventLoop) -> None:
    other = asyncio.new_event_loop()
    try:
        async def wrong_loop() -> None:
            await other.create_future()

        with pytest.raises(RuntimeError, match="not a future of its loop"):
            Driver(loop).run(wrong_loop())
    finally:
        other.close()


@pytest.mark.parametrize("debug", [False, True], ids=["stepped", "debug-loop-as-task"])
def test_a_loop_in_debug_mode_runs_the_coroutine_as_a_task(loop: asyncio.AbstractEventLoop, debug: bool) -> None:
    loop.set_debug(debug)

    async def which() -> tuple[bool, int]:
        await asyncio.sleep(0)
        return asyncio.current_task() is not None, 5

    assert Driver(loop).run(which()) == (debug, 5)


def _select_timeouts(loop: Any, monkeypatch: pytest.MonkeyPatch) -> list[float | None]:
    """The timeout of every poll of the loop's selector (0: a poll that does not sleep)."""
    timeouts: list[float | None] = []
    select = loop._selector.select

    def recorded(timeout: float | None = None) -> Any:
        timeouts.append(timeout)
        return select(timeout)

    monkeypatch.setattr(loop._selector, "select", recorded)
    return timeouts


@pytest.mark.parametrize("spin", [0.0, 0.005, 60.0], ids=["sleeps", "spins-then-sleeps", "spins-throughout"])
def test_a_wait_spins_for_its_budget_and_then_sleeps(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch, spin: float
) -> None:
    timeouts = _select_timeouts(loop, monkeypatch)

    async def waits_for_a_timer() -> str:
        future = loop.create_future()
        loop.call_later(0.05, future.set_result, "late reply")
        return await future

    assert Driver(loop, spin).run(waits_for_a_timer()) == "late reply"
    spun = [t for t in timeouts if t == 0]
    slept = [t for t in timeouts if t != 0]
    if spin == 0.0:
        assert slept and not spun
    elif spin == 60.0:
        assert len(spun) > 1 and not slept  # the reply came well within the budget
    else:
        assert timeouts[0] == 0 and timeouts[-1] > 0  # spun first, slept for the rest


@pytest.mark.parametrize("spin", [0.0, 60.0], ids=["sleeps", "spins"])
def test_a_spin_yields_the_core_between_looks(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch, spin: float
) -> None:
    # A peer queued behind a spinning rank on its core runs only when the spin
    # yields: each look that finds nothing gives the core away once.
    timeouts = _select_timeouts(loop, monkeypatch)
    yields = []
    monkeypatch.setattr(os, "sched_yield", lambda: yields.append(len(timeouts)))

    async def waits_for_a_timer() -> str:
        future = loop.create_future()
        loop.call_later(0.02, future.set_result, "late reply")
        return await future

    assert Driver(loop, spin).run(waits_for_a_timer()) == "late reply"
    spun = [t for t in timeouts if t == 0]
    assert len(yields) == (len(spun) - 1 if spin else 0)  # after every look but the one that found the reply


def test_the_spin_budget_comes_from_the_environment_or_the_ranks_per_core() -> None:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    assert spin_seconds({"LOCAL_WORLD_SIZE": str(cores)}) == DEFAULT_SPIN_SECONDS
    assert spin_seconds({"LOCAL_WORLD_SIZE": str(cores + 1)}) == 0.0  # oversubscribed: never spin
    assert spin_seconds({}) == 0.0  # ranks per host unknown
    assert spin_seconds({"ASYNCDIST_SPIN_US": "250", "LOCAL_WORLD_SIZE": str(cores + 1)}) == 250e-6
    assert spin_seconds({"ASYNCDIST_SPIN_US": "0", "LOCAL_WORLD_SIZE": "1"}) == 0.0
    with pytest.raises(ValueError, match="ASYNCDIST_SPIN_US must be a number of microseconds, got 'fast'"):
        spin_seconds({"ASYNCDIST_SPIN_US": "fast"})

"""LoopThread: who runs the loop, and that work goes on when nobody calls.

A blocking call runs the loop in the calling thread when the loop is free;
started operations keep it running in the daemon thread; a loop left free is
taken by the daemon after the grace period; a call that finds the loop taken,
or is made from a thread running a loop of its own, is handed over. Thread
identities say which thread ran what; threading events (never sleeps) say
when background work happened.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from typing import Any, Iterator

import pytest

from asyncdist.loop import choice as loop_choice
from asyncdist.loop import exits as loop_exits
from asyncdist.loop import thread as loop_thread
from asyncdist.errors import WrongThreadError
from asyncdist.loop.thread import LoopThread
from asyncdist.group.work import Work


@pytest.fixture
def no_idle_takeover(monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon never takes a free loop for being idle (only for demand):
    which thread runs a call must not depend on how fast the test gets to it."""
    monkeypatch.setattr(loop_thread, "IDLE_GRACE", 3600.0)


@pytest.fixture
def portal(no_idle_takeover: None) -> Iterator[LoopThread]:
    thread = LoopThread("test-loop")
    yield thread
    thread.stop()


async def _ident() -> int:
    await asyncio.sleep(0)  # a real turn of the loop, not only a step
    return threading.get_ident()


def test_a_blocking_call_runs_the_loop_in_the_calling_thread(portal: LoopThread) -> None:
    me = threading.get_ident()
    assert portal.run(_ident()) == me
    assert portal.call(threading.get_ident) == me
    assert portal.call(lambda a, b: a * b, 6, 7) == 42


def test_a_thread_running_its_own_loop_hands_its_call_over(portal: LoopThread) -> None:
    async def users_own_code() -> tuple[int, int]:
        return threading.get_ident(), portal.run(_ident())

    caller, runner = asyncio.run(users_own_code())
    assert runner != caller
    assert runner == portal._thread.ident


def test_with_caller_runs_off_every_call_is_handed_to_the_daemon(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(loop_thread.CALLER_RUNS_ENV, "0")
    thread = LoopThread("test-handed")
    try:
        assert [thread.run(_ident()) for _ in range(3)] == [thread._thread.ident] * 3
    finally:
        thread.stop()


def test_a_started_operation_finishes_while_the_caller_does_not_call(portal: LoopThread) -> None:
    # With an endless grace period (the fixture's) only the started Work's
    # demand can make the daemon run the loop.
    release = portal.call(portal.loop.create_future)
    ran_in: list[int] = []

    async def operation() -> str:
        await release
        ran_in.append(threading.get_ident())
        return "done"

    work = portal.start(lambda: Work.start(operation, "test operation", rank=0))
    portal.loop.call_soon_threadsafe(release.set_result, None)
    assert work.wait(timeout=30) is True
    assert work.value() == "done"
    assert ran_in == [portal._thread.ident]


def test_posted_starts_run_in_call_order_and_a_waiter_runs_the_loop_itself(portal: LoopThread) -> None:
    # A pending operation keeps the daemon running the loop (its demand), so
    # the posts after it are queued to the daemon, or run here when the loop
    # is free: either way in the order posted.
    release = portal.call(portal.loop.create_future)
    order: list[int] = []

    async def operation() -> int:
        await release
        return len(order)

    pending: list[Work] = []
    portal.post(lambda: pending.append(Work.start(operation, "held", rank=0)) or pending[0])
    for index in range(50):
        portal.post(lambda index=index: order.append(index))
    portal.loop.call_soon_threadsafe(release.set_result, None)
    waited_in: list[int] = []

    def future_of() -> Any:
        waited_in.append(threading.get_ident())
        return pending[0].future

    assert portal.wait_done(future_of) is True
    assert waited_in == [threading.get_ident()]  # the loop ran here, taken back from the daemon if it had it
    assert pending[0].is_completed() and order == list(range(50))
    assert pending[0].value() == 50  # every post ran before the operation resumed, as they were queued first


def test_a_blocking_call_steps_after_the_operations_started_before_it(
    portal: LoopThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A collective takes its call number at its first step, so an operation
    # started with async_op=True must step before a blocking call made after
    # it, whether or not the daemon turned the loop in between (here it never
    # does: the grace period is endless), or two ranks could number them apart.
    monkeypatch.setattr(loop_thread, "POST_GRACE", 3600.0)
    order: list[str] = []

    async def first_step(name: str) -> str:
        order.append(name)
        return name

    started: list[Work] = []
    portal.post(lambda: started.append(Work.start(lambda: first_step("started"), "started", rank=0)) or started[0])
    assert portal.run(first_step("blocking")) == "blocking"
    assert order == ["started", "blocking"]
    assert started[0].wait(timeout=30) and started[0].value() == "started"


def test_a_free_loop_is_taken_by_the_daemon_after_the_grace_period() -> None:
    # A task nobody started as an operation: no demand, so only the
    # daemon's idle rule runs it once the caller has let go of the loop.
    portal = LoopThread("test-idle")
    release = portal.call(portal.loop.create_future)
    finished = threading.Event()
    ran_in: list[int] = []

    async def background() -> None:
        await release
        ran_in.append(threading.get_ident())
        finished.set()

    portal.call(lambda: portal.loop.create_task(background()))
    portal.loop.call_soon_threadsafe(release.set_result, None)
    try:
        assert finished.wait(timeout=30)
        assert ran_in == [portal._thread.ident]
    finally:
        portal.stop()


def test_a_blocking_call_from_a_coroutine_on_the_loop_is_refused(portal: LoopThread) -> None:
    async def inner() -> None:
        raise AssertionError("must not run")

    async def outer() -> str:
        coro = inner()
        with pytest.raises(WrongThreadError, match="blocking call"):
            portal.run(coro, what="inner()")
        assert coro.cr_frame is None  # closed, not left to warn "never awaited"
        return "refused"

    assert portal.run(outer()) == "refused"


def test_errors_reach_the_caller_and_the_loop_stays_usable(portal: LoopThread) -> None:
    async def fails() -> None:
        await asyncio.sleep(0)
        raise ValueError("rank 3 said no")

    with pytest.raises(ValueError, match="rank 3 said no"):
        portal.run(fails())
    with pytest.raises(ZeroDivisionError):
        portal.call(lambda: 1 / 0)
    assert portal.run(_ident()) == threading.get_ident()


def test_many_threads_calling_at_once_each_get_their_own_result(portal: LoopThread) -> None:
    async def echo(value: int) -> int:
        await asyncio.sleep(0)
        return value

    results: dict[int, list[int]] = {}

    def caller(index: int) -> None:
        results[index] = [portal.run(echo(index * 1000 + i)) for i in range(200)]

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert results == {i: [i * 1000 + k for k in range(200)] for i in range(8)}


@pytest.fixture
def fresh_sigint() -> Iterator[None]:
    """Python's default SIGINT handler, whatever earlier tests installed
    (asyncdist's hook goes only over that one)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals reach the main thread only")
def test_ctrl_c_during_a_call_cancels_it_then_raises_keyboard_interrupt(fresh_sigint: None, no_idle_takeover: None) -> None:
    portal = LoopThread("test-ctrl-c")  # installs the hook over the default handler
    seen: list[str] = []

    async def interrupted() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        try:
            await portal.loop.create_future()  # never completes
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    try:
        assert signal.getsignal(signal.SIGINT) == loop_exits._on_signal
        with pytest.raises(KeyboardInterrupt):
            portal.run(interrupted())
        assert seen == ["cancelled"]
        assert portal.run(_ident()) == threading.get_ident()  # the loop is intact
        with pytest.raises(KeyboardInterrupt):  # outside a call: Python's own behaviour
            os.kill(os.getpid(), signal.SIGINT)
            threading.Event().wait(30)
    finally:
        portal.stop()


def test_stop_cancels_what_is_left_and_may_be_called_again() -> None:
    thread = LoopThread("test-stop")

    async def forever() -> None:
        await thread.loop.create_future()

    pending = thread.call(lambda: thread.loop.create_task(forever()))
    thread.stop()
    assert pending.cancelled()
    assert thread.loop.is_closed() and not thread._thread.is_alive()
    thread.stop()


def test_stop_cancels_a_blocking_call_another_thread_is_running(no_idle_takeover: None) -> None:
    thread = LoopThread("test-stop-caller")
    waiting = threading.Event()
    outcome: list[str] = []

    async def forever() -> None:
        waiting.set()
        await thread.loop.create_future()

    def caller() -> None:
        try:
            thread.run(forever())
        except asyncio.CancelledError:
            outcome.append("cancelled")

    blocked = threading.Thread(target=caller)
    blocked.start()
    assert waiting.wait(30)
    assert thread._owner == blocked.ident  # the caller runs the loop itself
    thread.stop()
    blocked.join(30)
    assert outcome == ["cancelled"]
    assert thread.loop.is_closed() and not thread._thread.is_alive()


def test_the_loop_is_asyncio_s_unless_uvloop_is_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(loop_choice.LOOP_ENV, raising=False)
    loop: Any = loop_choice.new_event_loop(default="asyncio")
    try:
        assert type(loop).__module__.startswith("asyncio")
    finally:
        loop.close()

"""One coroutine run to completion by the calling thread, on a loop it owns.

A blocking facade call runs its operation in the calling thread
(:class:`~asyncdist.loop.thread.LoopThread`). Wrapping the coroutine in a
Task and running the loop until the Task is done costs about 14 us per
call here before any work is done: the Task and its first step's callback,
arming the loop in ``run_forever``, a poll of the selector before the first
step, a turn of the loop to resume the Task after each future it awaited,
and a callback to stop. That alone is most of the 20 us the facade may add
to a call over the await API, where an ``await`` costs nothing of this.

A :class:`Driver` steps the coroutine itself, as a Task would, but in the
calling thread and without the callbacks: it sends into the coroutine until
it awaits a future, turns the loop one iteration at a time until that future
is done, and resumes the coroutine at once. An operation whose data is
already there completes with no turn of the loop at all. Every I/O event,
timer and callback is still run by the loop's own iteration, in its order.
Each step runs in a copy of the caller's context, as a Task's does, so
context variables set by the operation stay with it. There is no Task:
``asyncio.current_task()`` is None in the coroutine, so the await API keeps
``asyncio.timeout``, ``TaskGroup`` and (built on ``asyncio.timeout`` from
Python 3.12) ``asyncio.wait_for`` out of what the facade runs: it waits
with ``asyncio.wait(..., timeout=)``, which needs no Task.

Unlike ``run_forever``, a Driver does not install the loop's async
generator hooks while it runs (swapping them in and out costs 1.5-3 us per
call here). They only decide how an async generator *left unfinished* is
closed, and the facade runs asyncdist's own operations, which use none;
the Task path below runs under ``run_forever`` and has them.

While it waits, a Driver first *spins*: it turns the loop without
sleeping in the kernel, for up to :func:`spin_seconds`, and only then
lets the loop sleep until the next event. A small operation between two
ranks waits about 0.1-0.3 ms here; a thread that sleeps that long pays
for its wake-up and resumes on a cold core (measured: an 8-byte all_reduce
on 2 ranks took 370-430 us per call sleeping and 210-260 us spinning). MPI
libraries poll the same way, and like them a Driver does not spin when the
ranks on this host outnumber its cores: there the spin would take the core
that the peer it waits for needs. Between two looks it yields the core
(``sched_yield``): where other processes share the cores, the peer it waits
for may be queued behind it on its own core, and a spin that does not yield
keeps it there until the spin ends. On this 2-core VM with other jobs on
both cores (load 8), an 8-byte send/recv between 2 ranks of the facade took
2.7-3.0 ms one way spinning without yielding, and 0.17-0.34 ms not spinning.

Turning the loop by hand needs a few private parts of asyncio (its one
iteration, ``BaseEventLoop._run_once``, among them), all in
:mod:`asyncdist.loop.asyncio_internals`. Loops without them (uvloop) and a
loop in debug mode (whose iteration times callbacks) run the coroutine as a
Task under ``run_forever`` instead.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import os
import time
from typing import Any, Coroutine

from ..group.work import create_task_in
from .asyncio_internals import can_step, enter, leave, turn

__all__ = ["Driver"]

class Driver:
    """Runs coroutines on ``loop`` in the calling thread, one at a time (:meth:`run`).

    The caller of :meth:`run` must own ``loop``: no other thread runs it
    meanwhile, and this thread runs no other loop. One Driver serves every
    blocking call of a :class:`~asyncdist.loop.thread.LoopThread`, since
    only the thread that owns the loop runs it.
    """

    __slots__ = ("_loop", "_spin", "_steps", "running", "_cancel_requested", "_task")

    def __init__(self, loop: asyncio.AbstractEventLoop, spin: float = 0.0) -> None:
        self._loop = loop
        self._spin = spin  # seconds to spin before sleeping, per future awaited
        self._steps = can_step(loop)  # else (uvloop): as a Task
        self.running = False  # True while run() runs a coroutine
        self._cancel_requested = False
        self._task: asyncio.Task | None = None

    def runs(self, task: asyncio.Task | None) -> bool:
        """Whether ``task`` is the Task this Driver runs its coroutine as (a
        loop it cannot step, or debug mode); a stepped coroutine has none."""
        return task is not None and task is self._task

    def cancel(self) -> None:
        """Raise CancelledError in the running coroutine at the await it is
        stopped at (as ``Task.cancel``); nothing if none runs. Any thread, or
        a signal handler."""
        if not self.running:
            return
        task = self._task
        if task is not None:
            self._loop.call_soon_threadsafe(task.cancel)
            return
        self._cancel_requested = True
        self._loop.call_soon_threadsafe(_nothing)  # the turn under way returns, and sees it

    def run(self, coro: Coroutine[Any, Any, Any], context: contextvars.Context | None = None,
            queued_first: bool = False) -> Any:
        """Run ``coro`` to completion in ``context`` (a copy the caller made;
        default: a copy of the calling thread's) and return its result, or
        raise its exception.

        ``queued_first``: turn the loop once before the first step, so that
        the Tasks created before (whose first steps are queued) step first,
        as they would before a new Task's.
        """
        loop = self._loop
        if not self._steps or loop.get_debug():  # debug: the loop's iteration times callbacks
            return self._run_as_task(coro, context)
        run = (context or contextvars.copy_context()).run
        error: BaseException | None = None
        try:
            # Inside the try: a Ctrl-C raised before ``running`` is set (the
            # signal handler interrupts a call only once it runs) must still
            # leave the loop, or this thread stays marked as the loop's own.
            enter(loop)  # running in this thread, as run_forever marks it
            self.running = True
            if queued_first:
                turn(loop, True)
            while True:  # one step of the coroutine each, as a Task's (inline: a call costs here)
                try:
                    awaited = run(coro.send, None) if error is None else run(coro.throw, error)
                except StopIteration as done:
                    return done.value
                error = None
                if awaited is None:  # a bare yield (asyncio.sleep(0)): let the loop turn once
                    turn(loop, True)
                elif isinstance(awaited, _Future) and awaited.get_loop() is loop:
                    # (A Task would also reset the future's _asyncio_future_blocking
                    # flag: only Task's own check of a bare ``yield future`` reads it.)
                    spin_until = time.monotonic() + self._spin if self._spin else 0.0
                    while not awaited.done():
                        spinning = self._spin > 0.0 and time.monotonic() < spin_until
                        turn(loop, spinning)
                        if spinning and not awaited.done():
                            os.sched_yield()  # a runnable peer on this core goes first (see the module doc)
                        if self._cancel_requested and awaited.cancel():  # the coroutine's await raises it
                            self._cancel_requested = False
                else:
                    error = RuntimeError(f"a blocking asyncdist call awaited {awaited!r}, not a future of its loop")
                if self._cancel_requested:  # nothing awaited could take it: raise it at the next step
                    self._cancel_requested = False
                    error = asyncio.CancelledError()
        except BaseException:
            if inspect.getcoroutinestate(coro) == inspect.CORO_CREATED:
                coro.close()  # interrupted before its first step: no "never awaited" warning
            raise
        finally:
            self.running = self._cancel_requested = False
            leave(loop)

    def _run_as_task(self, coro: Coroutine[Any, Any, Any], context: contextvars.Context | None) -> Any:
        loop = self._loop
        self.running = True
        task = self._task = loop.create_task(coro) if context is None else create_task_in(loop, coro, context)
        try:
            if self._cancel_requested:
                task.cancel()
            task.add_done_callback(lambda _: loop.stop())
            while not task.done():
                loop.run_forever()
            return task.result()
        finally:
            self._task = None
            self.running = self._cancel_requested = False


_Future = asyncio.Future  # every asyncio future and Task (bound once: checked per step)


def _nothing() -> None:
    pass

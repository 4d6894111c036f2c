"""The one place where user threads meet the event loop.

The blocking facade owns a :class:`LoopThread`: an event loop on which every
engine, group and operation lives, and a daemon thread that runs it whenever
no user thread does. Other threads hand it work with :meth:`LoopThread.run`
(run a coroutine to completion), :meth:`LoopThread.call` (run a plain
function on the loop) and :meth:`LoopThread.start` (run a function that
starts operations, which then go on in the background).

**The caller runs the loop.** A blocking call whose loop is free runs the
loop in the calling thread until its coroutine is done: no thread hop, no
wake-up of another thread, which is most of what a small blocking call would
otherwise cost (the facade column of ``asyncdist-bench --api both`` measures it). The daemon runs the loop only when someone must
while no caller does:

* operations started by :meth:`start` (``isend``, ``async_op=True``) are
  *demand*: the daemon takes the loop as soon as their starter lets go of it,
  and keeps it until the last of them is done, so they progress while the
  user computes, as torch's do;
* a loop left free for :data:`IDLE_GRACE` seconds is taken too, so peers'
  messages are still read eagerly, heartbeats still go out and anything
  started without being counted as demand still finishes. The daemon looks
  for that by waking now and then, less often while callers keep the loop
  busy (at least every :data:`IDLE_LOOK_MAX` seconds): each look costs
  the callers (see :meth:`LoopThread._take_when_needed`);
* a call that finds the loop taken (by the daemon, or by another thread)
  hands its work over and waits, as every call did before; :meth:`LoopThread.post`
  does not wait: it queues its function, which the loop's runner calls in
  the order posted (the torch backend starts its operations so, while the
  caller goes on computing);
* a thread that waits for an operation (:meth:`LoopThread.wait_done`) runs
  the loop itself while it waits, taking it back from the daemon if need be,
  as a blocking call does.

``ASYNCDIST_CALLER_RUNS_LOOP=0`` turns the first rule off: the daemon then
keeps the loop always and every call is handed over.

The calling thread runs its call's coroutine with a
:class:`~asyncdist.loop.turns.Driver`: stepped like a Task, without one,
and spinning briefly before it sleeps (:func:`~asyncdist.transport.spinning.spin_seconds`).
The loop is asyncio's own unless ``ASYNCDIST_LOOP=uvloop``: only asyncio's
loop can be turned one iteration at a time by the Driver
(:mod:`~asyncdist.loop.asyncio_internals`), and uvloop
re-arms its signal wake-up (a new socket pair) each time the main thread
starts it, about 25 us per blocking call here, more than it saves.

A call made on the loop's own thread (from a coroutine running on it)
raises :class:`~asyncdist.errors.WrongThreadError`: it would wait for the
very loop it blocks (trio's rule, anyio's BlockingPortal). Every call runs
in a copy of the calling thread's context. torch orders an operation after
the work queued on the *calling* thread's current stream: a call run in the
calling thread finds that stream where it is; a call handed over, and one
that starts operations which go on after it returns (:meth:`start`), also
carries the thread's current CUDA streams in its context, when a GPU
library is in use (:func:`asyncdist.gpu.callers.caller_context`).

Ctrl-C during a call that runs the loop in the main thread cancels that
call's coroutine (the operation fails on the other ranks with an ABORT, as
for any cancellation) and then raises ``KeyboardInterrupt``; it never lands
in the middle of a loop callback (:mod:`asyncdist.loop.exits`).
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import signal
import threading
import time
from typing import Any, Callable, Coroutine

from .. import settings
from . import exits as loop_exits
from ..errors import ClosedError, WrongThreadError
from ..gpu.callers import caller_context
from .asyncio_internals import running_loop_or_none
from .choice import new_event_loop
from ..transport.spinning import forbid_spinning_here, spin_seconds
from .turns import Driver

__all__ = ["LoopThread", "CALLER_RUNS_ENV", "IDLE_GRACE", "IDLE_LOOK_MAX", "POST_GRACE"]

#: Set to "0" to hand every blocking call to the loop thread.
CALLER_RUNS_ENV = settings.name_of("caller_runs_loop")

#: Seconds a loop may stay free before the daemon takes it to run in the background.
IDLE_GRACE = 0.005

#: The longest the daemon waits between two looks at a loop that callers keep busy.
IDLE_LOOK_MAX = 0.1

#: Seconds the daemon leaves a loop alone after a caller posted work and let
#: it go (:meth:`LoopThread.post`): time for that caller to come back and wait
#: for its operation in its own thread, without a hand-over between threads.
POST_GRACE = 0.0003


class _Slot:
    """A one-shot result handed from the loop's thread to one waiting thread.

    A bare ``threading.Lock`` released by the loop is the cheapest wake-up
    between two threads in CPython; ``concurrent.futures.Future`` (a
    Condition and a waiter list) costs about twice as much per call.
    """

    __slots__ = ("done", "value", "error")

    def __init__(self) -> None:
        self.done = threading.Lock()
        self.done.acquire()
        self.value: Any = None
        self.error: BaseException | None = None

    def wait(self) -> Any:
        self.done.acquire()
        if self.error is not None:
            raise self.error
        return self.value


class LoopThread:
    """An event loop, run by the calling thread during a blocking call and by
    a daemon thread when work must go on between calls (see the module doc).

    A process that exits with the daemon still running the loop stops it
    first (:mod:`asyncdist.loop.exits`).
    """

    def __init__(self, name: str = "asyncdist-loop") -> None:
        self.loop = new_event_loop(default="asyncio")
        self._caller_runs = settings.current().caller_runs_loop  # as new_event_loop just read them
        # Who runs the loop: the thread holding _running_here, recorded in
        # _owner. Who needs it run: _demand and _released_at, guarded by _lock,
        # which the daemon waits on (_changed).
        self._running_here = threading.Lock()
        self._owner: int | None = None  # ident of the thread running the loop now
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._demand = 0  # started operations and handed-over calls not yet done
        self._wanted = 0  # callers waiting for the daemon to give the loop back (wait_done)
        self._grace_until = 0.0  # until then the daemon leaves the demand to the poster (POST_GRACE)
        # post()'s queue, oldest first: each function and its caller's context (streams)
        self._posted: collections.deque[tuple[Callable[[], Any], contextvars.Context | None]] = collections.deque()
        self._released_at = time.monotonic()
        # Operations started (start, post) whose Tasks have not taken a step yet
        # may be queued: the next call run here lets them step first (_drive).
        self._started = False
        self._stopping = False
        self._driver = Driver(self.loop, spin_seconds())  # runs the blocking calls of whichever caller owns the loop
        self._interrupted = 0  # the signal (SIGINT, SIGTERM) that cancelled the main thread's call now running
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        loop_exits.register(self)

    # -- the daemon ----------------------------------------------------------

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        forbid_spinning_here()  # it runs the loop while the callers do something else
        me = threading.get_ident()
        while self._take_when_needed(me):
            try:
                self.loop.run_forever()
            finally:
                self._release()

    def _take_when_needed(self, me: int) -> bool:
        """Daemon: wait until the loop must run here, and take it; False once stopping.

        Demand is not looked for: adding some, and releasing the loop while
        there is some, wakes the daemon. An idle loop is: each time the daemon
        wakes to find the loop in use or used within the grace period, it
        waits longer before it looks again, up to :data:`IDLE_LOOK_MAX`. A
        look costs the callers more than its own few lines: the daemon must
        then take the GIL from a caller, and until it has, each system call
        of the caller's (each poll of the loop) wakes it in vain. Looking
        every :data:`IDLE_GRACE` made a small blocking call between two ranks
        up to 19 % slower (median 9 %) than this, which is as fast as never
        looking.
        """
        later = 0.0  # how much later than the grace period ends the next look is
        with self._lock:
            while not self._stopping:
                idle = time.monotonic() - self._released_at
                if self._wanted:  # a waiting caller takes it next (wait_done); its release wakes us
                    self._changed.wait(IDLE_GRACE)
                    continue
                grace = self._grace_until - time.monotonic()
                if grace > 0:  # the caller that posted may come back to wait (POST_GRACE)
                    self._changed.wait(grace)
                    continue
                if self._demand or idle >= IDLE_GRACE or not self._caller_runs:
                    if self._running_here.acquire(blocking=False):
                        self._owner = me
                        return True
                    # a caller runs it: look again later (a wake-up per call would cost more)
                    idle = 0.0
                self._changed.wait(IDLE_GRACE - idle + later)
                later = min(2 * later or IDLE_GRACE, IDLE_LOOK_MAX)  # 0, 5, 10, 20 ... 100 ms
            return False

    # -- who runs the loop ---------------------------------------------------

    def _release(self) -> None:
        """The running thread lets go of the loop; the daemon takes it if work is left.

        Without ``_lock``: a caller pays for it only when the daemon must
        be told. The daemon tries to take the loop and starts to wait under
        ``_lock``, and the notice is given under it after the release, so
        the daemon either sees the loop free or is woken.
        """
        self._owner = None
        self._released_at = time.monotonic()
        self._running_here.release()
        if self._demand or self._stopping:
            with self._lock:
                self._changed.notify_all()

    def _add_demand(self) -> None:
        with self._lock:
            self._demand += 1
            self._changed.notify()

    def _demand_met(self, _: Any = None) -> None:
        """On the loop: one started operation or handed-over call is done.
        The daemon gives the loop back when none is left (a caller may want it)."""
        with self._lock:
            self._demand -= 1
            if not self._demand and self._owner == self._thread.ident and self._caller_runs:
                self.loop.stop()

    # -- running work ---------------------------------------------------------

    def _hand_over(self, coro: Coroutine[Any, Any, Any], what: str) -> Any:
        """Run ``coro`` on the loop in whichever thread runs it, and wait here."""
        if self.loop.is_closed():
            coro.close()
            raise _stopped(what)
        slot = _Slot()

        def finish(task: asyncio.Task) -> None:
            if task.cancelled():
                slot.error = asyncio.CancelledError()
            else:
                slot.error = task.exception()
                if slot.error is None:
                    slot.value = task.result()
            self._demand_met()
            slot.done.release()

        self._add_demand()
        self.loop.call_soon_threadsafe(
            lambda: self.loop.create_task(coro).add_done_callback(finish), context=caller_context()
        )
        return slot.wait()

    def run(self, coro: Coroutine[Any, Any, Any], what: str = "this call", capture_streams: bool = False) -> Any:
        """Run ``coro`` on the loop and return its result (any thread but the loop's).

        Args:
            what: the call's name, for errors.
            capture_streams: carry the calling thread's current device streams
                into ``coro``'s context even when ``coro`` runs in this thread,
                for a call that starts work going on after it returns (one
                handed to another thread always carries them).

        Raises:
            WrongThreadError: called from a coroutine running on this loop.
            ClosedError: the loop was stopped (:meth:`stop`).
        """
        running = running_loop_or_none()
        if running is None and self._caller_runs and self._running_here.acquire(False):
            # the loop is free: run it here (inline: a call costs on this path)
            self._owner = threading.get_ident()  # before the check: stop() waits for an owner it sees
            if self._stopping:
                self._release()
                return self._hand_over(coro, what)
            return self._drive(coro, caller_context() if capture_streams else None)
        if running is self.loop:
            coro.close()
            raise WrongThreadError(
                f"{what} is a blocking call and was made on asyncdist's event loop thread; "
                "inside coroutines use the await API (asyncdist.init_world / ProcessGroup)"
            )
        return self._hand_over(coro, what)  # taken, or this thread runs a loop of its own

    def _drive(self, coro: Coroutine[Any, Any, Any], context: contextvars.Context | None = None) -> Any:
        """Run ``coro`` on the loop, which this thread has taken, then let the loop go.

        Functions posted before (:meth:`post`) run first, in order. Ctrl-C or
        SIGTERM that cancelled the call (:meth:`interrupt`) is raised here.
        """
        try:
            if self._posted:  # started before this call: they go first, in order
                self._driver.run(_invoke(self._run_posted, ()))
            # A collective takes its call number at its first step: the ones started
            # before this call step first, on every rank, whoever ran the loop meanwhile.
            started, self._started = self._started, False
            result = self._driver.run(coro, context, queued_first=started)
        except asyncio.CancelledError:
            if not self._interrupted:
                raise
        finally:
            interrupted, self._interrupted = self._interrupted, 0
            self._release()
        if interrupted == signal.SIGINT:
            raise KeyboardInterrupt
        if interrupted:
            loop_exits.terminate(interrupted)
        return result

    def call(self, fn: Callable[..., Any], *args: Any, what: str = "this call") -> Any:
        """Run ``fn(*args)`` on the loop and return its result (any thread but the loop's)."""
        return self.run(_invoke(fn, args), what)

    def start(self, fn: Callable[..., Any], *args: Any, what: str = "this call") -> Any:
        """Run ``fn(*args)`` on the loop and return its result at once: the
        Work of the operation it started, or a list of them (anything with a
        ``future``, the operation's asyncio future, as :class:`Work` has).
        The loop keeps running, in the daemon if no caller runs it, until
        every one is done.
        """

        def begin() -> Any:
            started = fn(*args)
            self._started = True
            for work in started if isinstance(started, list) else [started]:
                if not work.future.done():
                    self._add_demand()
                    work.future.add_done_callback(self._demand_met)
            return started

        return self.run(_invoke(begin, ()), what, capture_streams=True)

    def post(self, fn: Callable[[], Any], what: str = "this call") -> None:
        """Run ``fn()`` on the loop without waiting for it (any thread but the loop's).

        In this thread at once if the loop is free, else in whichever thread
        runs it, as soon as it turns; posted functions run in the order they
        were posted, and before any later :meth:`run` of this thread. ``fn``
        returns what :meth:`start`'s function does (Works, whose operations
        keep the loop running until done) and must not raise: it reports
        its own errors (the torch backend fails the operation's Work).

        Raises:
            ClosedError: the loop was stopped (:meth:`stop`); ``what`` names the call.
        """
        self._posted.append((fn, caller_context()))  # its context carries the caller's device streams
        if running_loop_or_none() is None and self._caller_runs and self._running_here.acquire(False):
            self._owner = threading.get_ident()
            with self._lock:
                self._demand += 1  # no notice: the release below gives it
            if not self._stopping:
                self._grace_until = time.monotonic() + POST_GRACE
                self._drive(_invoke(self._run_posted, ()))
                return
            self._release()
        else:
            self._add_demand()  # the daemon keeps the loop until fn has run
        if self.loop.is_closed():
            self._posted.pop()
            raise _stopped(what)
        self.loop.call_soon_threadsafe(self._run_posted)

    def _run_posted(self) -> None:
        """On the loop: call every posted function, oldest first (see :meth:`post`)."""
        while self._posted:
            fn, context = self._posted.popleft()
            try:
                started = fn() if context is None else context.run(fn)
                self._started = True
                for work in started if isinstance(started, list) else [started]:
                    if work is not None and not work.future.done():
                        with self._lock:  # no notice: whoever runs the loop now tells the daemon when it lets go
                            self._demand += 1
                        work.future.add_done_callback(self._demand_met)
            finally:
                self._demand_met()

    def wait_done(self, future_of: Callable[[], asyncio.Future | None]) -> bool:
        """Run the loop in this thread until the future that ``future_of()``
        returns is done, as a blocking call does, taking the loop back from the
        daemon if it has it. ``future_of`` is called on the loop, after the
        posted functions ran (None: nothing to wait for). False, without
        waiting, where this thread cannot run the loop (another caller runs
        it, handing every call over is asked for, or this is a loop thread):
        the caller then waits its own way.
        """
        if not self._caller_runs or running_loop_or_none() is not None or self._stopping:
            return False
        with self._lock:
            if self._owner not in (None, self._thread.ident):
                return False  # another caller runs it: it runs the operation too
            self._wanted += 1
            from_daemon = self._owner == self._thread.ident
        try:
            if from_daemon:
                self.loop.call_soon_threadsafe(self._give_back)
            self._running_here.acquire()
            self._owner = threading.get_ident()
        finally:
            with self._lock:
                self._wanted -= 1
                if from_daemon:
                    self._changed.notify_all()  # the daemon waits for no caller now
        if self._stopping:
            self._release()
        else:
            self._drive(_until_done(future_of))
        return True

    def _give_back(self) -> None:
        """On the loop: the daemon stops running it, for a caller waiting in :meth:`wait_done`."""
        if self._wanted and self._owner == self._thread.ident:
            self.loop.stop()

    def stop(self) -> None:
        """Cancel what is left on the loop (blocking calls of other threads
        too), stop the daemon and close the loop."""
        if self.loop.is_closed():
            return
        if running_loop_or_none() is self.loop:
            raise WrongThreadError("LoopThread.stop() was called on its own loop; call it from another thread")

        async def cancel_rest() -> None:
            me = asyncio.current_task()
            if me is not None and not self._driver.runs(me):  # handed over: the driver runs another thread's call
                self._driver.cancel()
            tasks = [t for t in asyncio.all_tasks() if t is not me]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.run(cancel_rest(), "LoopThread.stop()")
        with self._lock:
            self._stopping = True
            self._changed.notify_all()
            if self._owner == self._thread.ident:
                self.loop.call_soon_threadsafe(self.loop.stop)
            while self._owner not in (None, self._thread.ident):  # a caller still runs it: wait for its release
                self._changed.wait()
        self._thread.join()
        self.loop.close()
        loop_exits.unregister(self)

    def interrupt(self, thread: int, signum: int) -> bool:
        """Ctrl-C or SIGTERM (``signum``) in ``thread``: cancel its call if it
        runs one on this loop (see :mod:`asyncdist.loop.exits`); False if it does not."""
        if self._owner != thread or not self._driver.running or self._interrupted:
            return False
        self._interrupted = signum  # a second signal does not wait
        self._driver.cancel()
        return True


def _stopped(what: str) -> ClosedError:
    return ClosedError(f"{what} was called after asyncdist's event loop was stopped: every process group "
                       "on it was shut down (destroy_process_group())")


async def _invoke(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    return fn(*args)


async def _until_done(future_of: Callable[[], asyncio.Future | None]) -> None:
    """Return once ``future_of()`` is done, whatever its outcome (it is not consumed here)."""
    future = future_of()
    if future is not None and not future.done():
        await asyncio.wait([future])

"""The one place where user threads meet the event loop.

The blocking facade owns a :class:`LoopThread`: a daemon thread running an
event loop (uvloop when installed) on which every engine, group and
operation lives. Other threads hand it work with :meth:`LoopThread.call`
(run a plain function on the loop) and :meth:`LoopThread.run` (run a
coroutine to completion), and get the result or the exception back.

Both refuse to run on the loop's own thread: a blocking call there would
wait for the very loop it blocks (trio's rule, anyio's BlockingPortal).

Both run the call in a copy of the calling thread's context that also holds
the thread's current CUDA streams, when a GPU library is in use
(:func:`asyncdist.gpu.callers.caller_context`): torch orders an operation
after the work queued on the *calling* thread's stream.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import multiprocessing.util
import os
import threading
import weakref
from typing import Any, Callable, Coroutine

from .errors import WrongThreadError
from .gpu.callers import caller_context

__all__ = ["LoopThread", "new_event_loop", "call_at_exit", "LOOP_ENV"]

log = logging.getLogger("asyncdist")

#: Set to "asyncio" to use the standard loop even when uvloop is installed.
LOOP_ENV = "ASYNCDIST_LOOP"


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop's when installed (unless ASYNCDIST_LOOP=asyncio)."""
    if os.environ.get(LOOP_ENV, "").lower() != "asyncio":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


class _Slot:
    """A one-shot result handed from the loop thread to one waiting thread.

    A bare ``threading.Lock`` released by the loop is the cheapest wake-up
    between two threads in CPython; ``concurrent.futures.Future`` (a
    Condition and a waiter list) costs about twice as much per call, which
    is most of the blocking facade's overhead for small messages.
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


def call_at_exit(fn: Callable[[], None], priority: int) -> None:
    """Run ``fn`` when this process exits normally, also as a multiprocessing
    child (which skips ``atexit``); higher ``priority`` runs first.

    ``fn`` must be idempotent (it may be called twice) and runs only in the
    process that registered it, not in forked children that inherit it.
    """
    pid = os.getpid()

    def in_this_process() -> None:
        if os.getpid() == pid:
            try:
                fn()
            except Exception:  # exiting anyway: say why, and let the rest run
                log.exception("asyncdist: cleanup at exit failed")

    # threading's exit hooks run before thread pools shut down (atexit's run
    # after), and closing a group still hands its store's close to one.
    getattr(threading, "_register_atexit", atexit.register)(in_this_process)
    multiprocessing.util.Finalize(None, in_this_process, exitpriority=priority)


_running: weakref.WeakSet[LoopThread] = weakref.WeakSet()
_stop_at_exit_registered_in: int | None = None


def _stop_all() -> None:
    for portal in list(_running):
        portal.stop()


class LoopThread:
    """An event loop running in a daemon thread, and the bridge into it.

    A process that exits with the thread still running (a script that never
    called ``destroy_process_group``) stops it first: interpreter shutdown
    with uvloop still running on a daemon thread can crash the process
    (SIGSEGV; seen on about 40% of such exits here).
    """

    def __init__(self, name: str = "asyncdist-loop") -> None:
        global _stop_at_exit_registered_in
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        _running.add(self)
        if _stop_at_exit_registered_in != os.getpid():
            _stop_at_exit_registered_in = os.getpid()
            call_at_exit(_stop_all, priority=10)

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def _check_thread(self, what: str) -> None:
        if threading.current_thread() is self._thread:
            raise WrongThreadError(
                f"{what} is a blocking call and was made on asyncdist's event loop thread; "
                "inside coroutines use the await API (asyncdist.init_world / ProcessGroup)"
            )

    def call(self, fn: Callable[..., Any], *args: Any, what: str = "this call") -> Any:
        """Run ``fn(*args)`` on the loop thread and return its result (any other thread)."""
        self._check_thread(what)
        slot = _Slot()

        def invoke() -> None:
            try:
                slot.value = fn(*args)
            except BaseException as exc:
                slot.error = exc
            slot.done.release()

        self.loop.call_soon_threadsafe(invoke, context=caller_context())
        return slot.wait()

    def run(self, coro: Coroutine[Any, Any, Any], what: str = "this call") -> Any:
        """Run ``coro`` on the loop and wait for its result (any other thread)."""
        try:
            self._check_thread(what)
        except WrongThreadError:
            coro.close()
            raise
        slot = _Slot()

        def finish(task: asyncio.Task) -> None:
            if task.cancelled():
                slot.error = asyncio.CancelledError()
            else:
                slot.error = task.exception()
                if slot.error is None:
                    slot.value = task.result()
            slot.done.release()

        self.loop.call_soon_threadsafe(
            lambda: self.loop.create_task(coro).add_done_callback(finish), context=caller_context()
        )
        return slot.wait()

    def stop(self) -> None:
        """Cancel what is left on the loop, stop it and join the thread."""
        self._check_thread("LoopThread.stop()")
        if not self._thread.is_alive():
            return

        async def cancel_rest() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.run(cancel_rest())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()
        _running.discard(self)

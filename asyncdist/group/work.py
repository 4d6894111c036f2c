"""``Work``: the handle of an operation in flight, for both faces.

A Work wraps the asyncio future of one operation. Coroutines ``await`` it
(on the loop's thread); blocking code calls :meth:`Work.wait` from any other
thread, as torch.distributed's ``Work.wait()``. The future always lives on
the engine's loop: ``wait`` never touches it, it waits on a
``threading.Event`` that the future's done-callback sets, so a Work can be
shared between the loop thread and user threads without locks.

A Work also holds the :class:`~asyncdist.engine.progress.Progress` of its
operation, so that a ``wait`` that gives up can say where the operation is
stuck: the collective call and its number, the group, and the peers it
still waits on (the same words as the group's own timeout). A timed-out
``wait`` does not abort the operation, as torch's ``Work::wait(timeout)``
does not: the operation keeps its own deadline, the group's timeout.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import sys
import threading
from datetime import timedelta
from typing import Any, Callable, Coroutine, Generator

from .._torch import torch_future, torch_or_none
from ..errors import OperationCancelledError, OperationTimeoutError, WrongThreadError
from ..timeouts import as_seconds
from ..gpu.callers import after_wait
from ..engine.progress import WAIT_TIMEOUT, Awaited, Progress, context_for

__all__ = ["Work", "completed_future", "create_task_in"]


def create_task_in(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], context: contextvars.Context
) -> asyncio.Task:
    """``loop.create_task(coro)`` with the task running in ``context``.

    Python 3.11 takes the context itself (``create_task(context=)``); on
    3.10 the task runs in a copy of it, made inside it: the same values, so
    what the operation registers in a shared object (its Progress) is seen.
    """
    if sys.version_info >= (3, 11):
        return loop.create_task(coro, context=context)
    return context.run(loop.create_task, coro)

# Guards the lazy creation of a Work's event when several threads wait at once.
_EVENT_LOCK = threading.Lock()


def completed_future(loop: asyncio.AbstractEventLoop, result: Any = None) -> asyncio.Future:
    """A future that is already done with ``result`` (for operations that finished at once)."""
    future = loop.create_future()
    future.set_result(result)
    return future


class Work:
    """A handle on an asynchronous operation (``isend``, ``irecv``, collectives).

    Create it on the loop thread; use it from any thread.

    Args:
        future: the operation's future, on the engine's loop.
        op: what the operation is, for error messages ("send to rank 1").
        outputs: the tensors the operation writes or reads, returned by
            :meth:`result` as torch's ``Work.result()`` does.
        progress: what the operation has under way, for the message of a
            timed-out :meth:`wait` (None: that message names only ``op``).
    """

    __slots__ = ("_future", "_loop", "_op", "_outputs", "_event", "_progress")

    def __init__(
        self, future: asyncio.Future, op: str, outputs: list | None = None, progress: Progress | None = None
    ) -> None:
        self._future = future
        self._loop = future.get_loop()
        self._op = op
        self._outputs = outputs if outputs is not None else []
        self._event: threading.Event | None = None
        self._progress = progress
        if future.done():  # (an operation that finished at once: no callback left queued on the loop)
            self._on_done(future)
        else:
            future.add_done_callback(self._on_done)

    @classmethod
    def start(
        cls,
        operation: Callable[[], Coroutine[Any, Any, Any]],
        op: str,
        outputs: list | None = None,
        *,
        rank: int,
    ) -> Work:
        """Run ``operation()`` as a task of the running loop and return its Work.

        Loop thread only. ``operation`` is called here, so an argument error
        it raises before its coroutine exists raises here, at once. The
        coroutine (and any task it starts) runs in a context that records
        each collective call it opens in the Work's
        :class:`~asyncdist.engine.progress.Progress`, which is how a timed-out
        :meth:`wait` names the call and the peers it waits on.

        Args:
            operation: makes the coroutine, e.g. ``lambda: group.all_reduce(t)``.
            op: the operation for messages ("all_reduce on group 'world'").
            outputs: as for :class:`Work`.
            rank: this process's global rank, for messages.

        Example::

            work = Work.start(lambda: group.all_reduce(x), "all_reduce", [x], rank=group.ranks[group.rank])
            await asyncio.to_thread(work.wait, 5.0)   # blocking waits belong to other threads
        """
        progress = Progress(rank, op)
        context = context_for(progress)
        coroutine = context.run(operation)
        task = create_task_in(asyncio.get_running_loop(), coroutine, context)
        return cls(task, op, outputs, progress)

    @property
    def future(self) -> asyncio.Future:
        """The operation's asyncio future (loop thread only; others :meth:`wait`)."""
        return self._future

    def _on_done(self, future: asyncio.Future) -> None:
        if not future.cancelled():
            future.exception()  # the error is kept for wait()/exception(); don't log it as lost
        self._progress = None  # what it was waiting on no longer matters; let the steps go
        event = self._event
        if event is not None:
            event.set()

    def __await__(self) -> Generator[Any, None, Any]:
        """Await completion (loop thread); returns the operation's value
        (for ``irecv``, the sender's rank) or raises its error."""
        return self._future.__await__()

    def __repr__(self) -> str:
        state = "pending" if not self._future.done() else ("ok" if self.is_success() else "failed")
        return f"<Work {self._op}: {state}>"

    def wait(self, timeout: timedelta | float | None = None) -> bool:
        """Block until the operation completes; return True, or raise its error.

        Any thread but the loop's own (blocking there would deadlock).

        Args:
            timeout: a ``timedelta`` or seconds; ``None`` or 0 (torch's "no
                timeout") waits as long as the operation's own timeout allows.

        Raises:
            OperationTimeoutError: not completed within ``timeout``. The
                message names the call, its number, the group and the peers
                the operation still waits on. The operation itself goes on
                (as with torch) and ``wait`` may be called again.
            WrongThreadError: called on the event loop's thread.
            asyncio.CancelledError: the operation was cancelled (its task,
                or the loop thread stopped); as asyncio's ``Future.result()``.
            Exception: the operation's own error (PeerLostError, …).
        """
        future = self._future
        if not future.done():
            if _on_loop_thread(self._loop):
                raise WrongThreadError(
                    f"Work.wait() for {self._op} was called on the event loop's thread; use 'await work' there"
                )
            # torch: no timeout, or a zero one, means no limit.
            seconds = as_seconds(timeout, default=0.0, what="Work.wait: timeout", positive=False) or None
            event = self._waiter_event()
            # The done-callback may have run before the event existed; it runs
            # only after the future is done, so check again.
            if not future.done() and not event.wait(seconds):
                assert seconds is not None  # event.wait(None) returns only once set
                progress = self._progress  # read before done(): it is cleared only once done
                if not future.done():  # else it finished just now: report that instead
                    raise self._wait_timeout(progress, seconds)
        if future.cancelled():
            raise self._cancelled()
        error = future.exception()
        if error is not None:
            raise error
        after_wait(future)  # device results: the current stream waits for them (torch's rule)
        return True

    def _wait_timeout(self, progress: Progress | None, seconds: float) -> OperationTimeoutError:
        """The error of a wait that gave up: where the operation is stuck, if known."""
        if progress is not None:
            return progress.timeout_error(seconds)
        return OperationTimeoutError(f"{self._op} Timed out after {seconds:g} s{WAIT_TIMEOUT}")

    def _cancelled(self) -> asyncio.CancelledError:
        return asyncio.CancelledError(f"{self._op} was cancelled")

    def _waiter_event(self) -> threading.Event:
        """The one event every waiting thread shares (created on first use)."""
        with _EVENT_LOCK:
            if self._event is None:
                self._event = threading.Event()
            return self._event

    def waiting(self) -> tuple[str, Awaited] | None:
        """Where the running operation is and the peers it awaits now (any
        thread; :meth:`Progress.waiting`); None once it is done, or for an
        operation made without a Progress."""
        progress = self._progress
        return None if progress is None or self._future.done() else progress.waiting()

    def is_completed(self) -> bool:
        """True once the operation has finished, successfully or not."""
        return self._future.done()

    def is_success(self) -> bool:
        """True if the operation finished without error."""
        future = self._future
        return future.done() and not future.cancelled() and future.exception() is None

    def exception(self) -> BaseException | None:
        """The operation's error, or None (also while it is still running);
        ``asyncio.CancelledError`` for a cancelled one."""
        future = self._future
        if not future.done():
            return None
        if future.cancelled():
            return self._cancelled()
        return future.exception()

    def value(self) -> Any:
        """The operation's value once complete (for ``irecv``, the sender's rank)."""
        self.wait()
        return self._future.result()

    def result(self) -> list:
        """Wait, then return the operation's tensors (torch's ``Work.result()``)."""
        self.wait()
        return list(self._outputs)

    def source_rank(self) -> int:
        """For a receive: the rank the message came from (waits for it)."""
        return self.value()

    _source_rank = source_rank  # torch's spelling

    def get_future(self) -> Any:
        """A future completed with :meth:`result`'s list when the operation ends.

        A ``torch.futures.Future`` when torch is installed (so ``.then()`` and
        ``.wait()`` work as in torch), else a ``concurrent.futures.Future``.
        A torch future of a cancelled operation fails with
        :class:`~asyncdist.errors.OperationCancelledError`: torch's futures
        take no ``asyncio.CancelledError``, and one left incomplete would
        hang its waiters.
        """
        torch = torch_or_none()
        target = torch_future(torch, self._outputs) if torch is not None else concurrent.futures.Future()

        def transfer(future: asyncio.Future) -> None:
            error = self.exception()
            if error is not None:
                if torch is not None and not isinstance(error, Exception):
                    cancelled, error = error, OperationCancelledError(str(error))
                    error.__cause__ = cancelled
                target.set_exception(error)
            else:
                after_wait(future)  # device results: the future's events follow them
                target.set_result(list(self._outputs))

        if self._future.done():
            transfer(self._future)
        else:
            self._loop.call_soon_threadsafe(self._future.add_done_callback, transfer)
        return target


def _on_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False

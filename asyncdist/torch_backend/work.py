"""``TorchWork``: an asyncdist operation, as the ``Work`` torch.distributed expects.

Every method of the backend returns one, at once: the operation is *posted*
to the backend's loop (:meth:`LoopThread.post <asyncdist.loop.thread.LoopThread.post>`),
started in the calling thread when the loop is free, else by the loop's
runner as soon as it turns, in the order of the calls, while torch's thread
goes on (a DDP backward computes the next buckets' gradients). The
asyncdist :class:`~asyncdist.group.work.Work` of the operation is bound to
the TorchWork when it starts. ``wait()`` blocks for as long as the caller
asks, and raises the operation's own asyncdist error
(:class:`~asyncdist.errors.PeerLostError`, :class:`~asyncdist.errors.CollectiveMismatchError`, ...)
naming the rank; an argument error found when the operation starts is
raised by the call if it started in the calling thread, else by ``wait()``.

A call that torch waits on at once (its ``opts.asyncOp`` is False: torch's
Python functions without ``async_op=True``) is not posted: it runs to
completion in the calling thread, as the facade's blocking calls do, and
returns its Work completed (:meth:`TorchWork.ran`). Posting it would cost a
Task, a wake-up of the daemon thread and a second pass through the loop,
which made a small call through torch.distributed about twice the facade's.

**The waiter runs the loop.** A ``wait()`` without a timeout runs the loop
in the waiting thread until the operation is done, as the blocking facade
runs its calls (taking the loop back from the backend's daemon thread if
that runs it): no hop to the loop thread and back, and the waiter spins
briefly for the data where the cores allow (:mod:`asyncdist.loop.turns`).

The ``torch.futures.Future`` that :meth:`TorchWork.get_future` returns is
made on the first call. When the operation ends, its done-callback on the
loop thread hands the outcome to a thread of :data:`COMPLETIONS`, which
completes the future with the operation's tensors or its error (a future
asked for after the operation ended is completed at once, in the asking
thread). Callbacks chained with ``.then()`` therefore never run on the
loop: DDP's comm hooks may block there (PowerSGD's hook waits for an
all-reduce inside a callback), as they may on gloo's worker threads, while
the loop carries on with the operation they wait for.
A torch future cannot carry a Python exception to C++ (see
:func:`_raise_error`): there the error arrives as a RuntimeError with the
asyncdist error's name and message.

Why a subclass of torch's ``Work`` rather than the ``Work`` that
``torch._C._distributed_c10d._create_work_from_future`` makes: with torch
2.13 that Work (``FutureWrappingWork``) returns True from ``wait()`` when its
future failed, so an error would be lost (and the error object would become
the future's value); it raises "not implemented" for a finite ``wait``
timeout; and it has no source rank, which ``recv`` from any source needs.
A Python subclass overrides ``wait`` and ``get_future`` for C++ callers too
(torch's ``PyWork`` trampoline), which is what DDP's reducer calls.

Thread affinity: made on the calling thread and bound on the loop's; used
from any thread (``wait`` refuses the loop's own thread, where it would
deadlock).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any, Callable, Coroutine

import torch
import torch.distributed as tdist

from .._torch import torch_future
from ..engine.progress import Awaited
from ..group.work import Work, completed_future
from ..loop.thread import LoopThread

__all__ = ["TorchWork", "COMPLETIONS"]

#: The threads that complete the operations' torch futures, and so run their
#: ``.then()`` callbacks. Several, because a callback may wait for another
#: operation whose future needs a thread of its own to complete (gloo runs
#: callbacks on its worker threads, with the same limit on nesting).
COMPLETIONS = ThreadPoolExecutor(max_workers=8, thread_name_prefix="asyncdist-torch-futures")


class TorchWork(tdist.Work):
    """torch's ``Work`` over an asyncdist :class:`~asyncdist.group.work.Work`.

    Args:
        work: the running operation (its value is the sender's group rank for
            a receive); None for one not started yet (:meth:`post`).
        outputs: the tensors the operation writes (or sends), which
            ``result()`` and the future's value are.
        portal: the loop thread the operation runs on, which :meth:`wait`
            runs in the waiting thread (None: ``wait`` only waits).
    """

    def __init__(self, work: Work | None, outputs: list, portal: LoopThread | None = None) -> None:
        super().__init__()
        self._outputs = outputs
        self._portal = portal
        self._start_error: BaseException | None = None
        # Set once started (or failed to start); None for a Work made started.
        self._bound: threading.Event | None = threading.Event() if work is None else None
        self._lock = threading.Lock()  # _future's creation against _bind
        self._future: Any = None  # made by the first get_future()
        self._work: Work | None = work  # bound already: no other thread knows of this TorchWork yet

    @classmethod
    def post(cls, portal: LoopThread, start: Callable[[], Work], outputs: list, what: str) -> TorchWork:
        """Start ``start()`` (which makes the operation's Work, on the loop) without
        waiting for the loop (:meth:`LoopThread.post`), and return its TorchWork.

        Raises:
            Exception: the error ``start`` raised, if it ran in this thread
                (the loop was free); otherwise :meth:`wait` raises it.
            ClosedError: the loop thread was stopped (``what`` names the call).
        """
        return cls(None, outputs, portal).post_start(start, what)

    @classmethod
    def ran(cls, portal: LoopThread, operation: Callable[[], Coroutine[Any, Any, Any]], op: str,
            outputs: list) -> TorchWork:
        """Run ``operation()`` to completion now, as a blocking facade call runs
        (:meth:`LoopThread.run`), and return its completed TorchWork, whose
        ``wait()`` raises the operation's error as a started one's does.

        For a call that torch waits on at once (``opts.asyncOp`` False): a
        posted start, a wake-up of the daemon and a Task would cost more than
        the operation between two ranks, and there is nothing to overlap.
        """
        try:
            value = portal.run(operation(), what=op)
        except Exception as error:  # wait() raises it, as for a started operation
            work = cls(None, outputs)
            work._fail_start(error)
            return work
        # A done future, made here: nothing of it ever runs on the loop.
        return cls(Work(completed_future(portal.loop, value), op, outputs), outputs)

    def post_start(self, start: Callable[[], Work], what: str) -> TorchWork:
        """:meth:`post` for a TorchWork made without its Work (``work=None``): bind
        it to the Work ``start()`` makes once the loop runs it; return ``self``."""
        assert self._portal is not None and self._work is None, "post_start: a TorchWork with a portal, not started"

        def begin() -> Work | None:
            try:
                work = start()
            except Exception as exc:  # an argument error: the operation's error
                self._fail_start(exc)
                return None
            self._bind(work)
            return work

        self._portal.post(begin, what)
        error = self._start_error
        if error is not None:
            raise error
        return self

    def _bind(self, work: Work) -> None:
        """The operation started (loop thread, or a thread that runs it)."""
        with self._lock:
            self._work = work
            if self._future is not None:
                _complete_from(work, self._future[0], here=False)  # never on the loop thread
        if self._bound is not None:
            self._bound.set()

    def _fail_start(self, error: BaseException) -> None:
        with self._lock:
            self._start_error = error
            if self._future is not None:
                self._future[0].set_result(error)  # _raise_error fails the chained future
        if self._bound is not None:
            self._bound.set()

    def __repr__(self) -> str:
        return f"<TorchWork {self._work!r}>" if self._work is not None else "<TorchWork (starting)>"

    def _started(self) -> Work:
        """The operation's Work, once it started; raises the error that kept it from starting."""
        if self._bound is not None:
            self._bound.wait()  # the loop's runner starts it, if no waiter did
        if self._start_error is not None:
            raise self._start_error
        assert self._work is not None
        return self._work

    @property
    def future(self) -> Any:
        """The operation's asyncio future (loop thread only); None while it has
        not started (its start is still posted) or if it failed to start."""
        return None if self._work is None else self._work.future

    def wait(self, timeout: timedelta | float | None = None) -> bool:
        """Block until the operation completes; return True or raise its error.

        Without a timeout, the waiting thread runs the loop meanwhile where it
        can (see the module doc).

        Args:
            timeout: a ``timedelta`` or seconds; None or 0 (torch's "no
                timeout") waits as long as the group's own timeout allows.

        Raises:
            OperationTimeoutError: not complete within ``timeout`` (the
                operation goes on; ``wait`` may be called again).
            WrongThreadError: called on the backend's loop thread.
            AsyncDistError: the operation's error (PeerLostError, ...).
        """
        if not timeout and self._portal is not None and not self.is_completed():
            self._portal.wait_done(lambda: self.future)
        return self._started().wait(timeout)

    def get_future(self) -> Any:
        """A ``torch.futures.Future`` completed with :meth:`result`'s list, or failed
        with a RuntimeError that carries the asyncdist error's name and message."""
        with self._lock:
            if self._future is None:
                handed: torch.futures.Future[Any] = torch_future(torch, self._outputs)
                self._future = (handed, handed.then(_raise_error))
                if self._work is not None:
                    _complete_from(self._work, handed, here=True)
                elif self._start_error is not None:
                    handed.set_result(self._start_error)
            return self._future[1]

    def is_completed(self) -> bool:
        if self._start_error is not None:
            return True
        return self._work is not None and self._work.is_completed()

    def waiting(self) -> tuple[str, Awaited] | None:
        """Where the running operation is and the peers it awaits (any thread);
        None once done, or while not started (:meth:`asyncdist.group.work.Work.waiting`)."""
        return None if self._work is None else self._work.waiting()

    def is_success(self) -> bool:
        return self._work is not None and self._work.is_success()

    def exception(self) -> BaseException | None:
        if self._start_error is not None:
            return self._start_error
        return None if self._work is None else self._work.exception()

    def result(self) -> list:
        """Wait, then return the operation's tensors."""
        self.wait()
        return list(self._outputs)

    def source_rank(self) -> int:
        """For a receive: the sender's group rank (waits for the message)."""
        self.wait()
        return self._started().value()

    _source_rank = source_rank  # what torch's recv() calls

    def synchronize(self) -> None:
        """Make the current stream wait for the operation's CUDA results (waiting
        for the operation on the host first); nothing for CPU tensors."""
        if any(getattr(tensor, "is_cuda", False) for tensor in self._outputs):
            self.wait()


def _complete_from(work: Work, handed: Any, *, here: bool) -> None:
    """Complete the torch future ``handed`` with ``work``'s outcome: on a thread of
    COMPLETIONS when it ends, or at once in this thread if it has ended and
    ``here`` (a user's thread, never the loop's)."""
    on_loop = work.get_future()  # completed by the operation's done-callback, on the loop thread

    def settle(_: Any = None) -> None:
        try:
            handed.set_result(on_loop.wait())  # wait(): this thread's streams follow device results
        except Exception as exc:  # the operation's error, raised by wait()
            handed.set_result(exc)  # _raise_error turns it into a failure

    if here and on_loop.done():
        settle()
    else:
        on_loop.add_done_callback(lambda _: COMPLETIONS.submit(settle))


def _raise_error(future: Any) -> Any:
    """Turn a torch future that holds an error *as its value* into a failed one.

    ``torch.futures.Future.set_exception`` (Python) stores the exception as
    the future's value and raises it only for Python's ``wait()``/``value()``;
    C++ consumers (DDP's reducer) would take the exception object for the
    result (torch 2.13 then crashes reading a tensor out of it). An error
    raised in a ``then`` callback fails the chained future in C++ terms, as a
    RuntimeError "Got the following error when running the callback:
    PeerLostError: rank 0 lost rank 1 ...".
    """
    value = future.value()  # raises the stored error on torch versions that unwrap it here
    if isinstance(value, BaseException):
        raise value
    return value

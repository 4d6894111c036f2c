"""``TorchWork``: an asyncdist operation, as the ``Work`` torch.distributed expects.

Every method of the backend returns one. It wraps the asyncdist
:class:`~asyncdist.group.work.Work` of an operation already running on the
backend's loop thread, so torch's calling thread never waits for more than
the hop that starts the operation; ``wait()`` then blocks for as long as the
caller asks, and raises the operation's own asyncdist error
(:class:`~asyncdist.errors.PeerLostError`, :class:`~asyncdist.errors.CollectiveMismatchError`, ...)
naming the rank.

The ``torch.futures.Future`` that :meth:`TorchWork.get_future` returns is
made once, when the operation starts. When the operation ends, its
done-callback on the loop thread hands the outcome to a thread of
:data:`COMPLETIONS`, which completes the future with the operation's tensors
or its error. Callbacks chained with ``.then()`` therefore run on that
thread, never on the loop: DDP's comm hooks may block there (PowerSGD's
hook waits for an all-reduce inside a callback), as they may on gloo's
worker threads, while the loop carries on with the operation they wait for.
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

Thread affinity: created on the loop thread; used from any thread (``wait``
refuses the loop's own thread, where it would deadlock).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as tdist

from .._torch import torch_future
from ..engine.progress import Awaited
from ..group.work import Work

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
            a receive).
        outputs: the tensors the operation writes (or sends), which
            ``result()`` and the future's value are.
    """

    def __init__(self, work: Work, outputs: list) -> None:
        super().__init__()
        self._work = work
        self._outputs = outputs
        self._future = _future_of(work, outputs)

    def __repr__(self) -> str:
        return f"<TorchWork {self._work!r}>"

    @property
    def future(self) -> Any:
        """The asyncdist operation's asyncio future (loop thread only), which
        keeps the loop running until it is done (:meth:`LoopThread.start`)."""
        return self._work.future

    def wait(self, timeout: timedelta | float | None = None) -> bool:
        """Block until the operation completes; return True or raise its error.

        Args:
            timeout: a ``timedelta`` or seconds; None or 0 (torch's "no
                timeout") waits as long as the group's own timeout allows.

        Raises:
            OperationTimeoutError: not complete within ``timeout`` (the
                operation goes on; ``wait`` may be called again).
            WrongThreadError: called on the backend's loop thread.
            AsyncDistError: the operation's error (PeerLostError, ...).
        """
        return self._work.wait(timeout)

    def get_future(self) -> Any:
        """A ``torch.futures.Future`` completed with :meth:`result`'s list, or failed
        with a RuntimeError that carries the asyncdist error's name and message."""
        return self._future

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def waiting(self) -> tuple[str, Awaited] | None:
        """Where the running operation is and the peers it awaits (any thread);
        None once done (:meth:`asyncdist.group.work.Work.waiting`)."""
        return self._work.waiting()

    def is_success(self) -> bool:
        return self._work.is_success()

    def exception(self) -> BaseException | None:
        return self._work.exception()

    def result(self) -> list:
        """Wait, then return the operation's tensors."""
        self._work.wait()
        return list(self._outputs)

    def source_rank(self) -> int:
        """For a receive: the sender's group rank (waits for the message)."""
        return self._work.value()

    _source_rank = source_rank  # what torch's recv() calls

    def synchronize(self) -> None:
        """Make the current stream wait for the operation's CUDA results (waiting
        for the operation on the host first); nothing for CPU tensors."""
        if any(getattr(tensor, "is_cuda", False) for tensor in self._outputs):
            self._work.wait()


def _future_of(work: Work, outputs: list) -> torch.futures.Future[Any]:
    """A torch future of ``work``, completed on a thread of COMPLETIONS (call on the loop thread)."""
    on_loop = work.get_future()  # completed by the operation's done-callback, on the loop thread
    handed: torch.futures.Future[Any] = torch_future(torch, outputs)

    def settle() -> None:
        try:
            handed.set_result(on_loop.wait())  # wait(): this thread's streams follow device results
        except Exception as exc:  # the operation's error, raised by wait()
            handed.set_result(exc)  # _raise_error turns it into a failure

    on_loop.add_done_callback(lambda _: COMPLETIONS.submit(settle))
    return handed.then(_raise_error)


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

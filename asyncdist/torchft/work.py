"""``TorchftWork``: an asyncdist operation, as torchft's Manager waits on it.

torchft 0.2.0's Manager handles a failed collective through the operation's
*future*, not through ``Work.wait()``: ``Manager.allreduce`` returns a
``_ManagedWork`` whose ``wait()`` first waits on the process group's Work,
then chains its callbacks on that Work's future, and reports an error that
reaches the end of the chain to the Manager (the step is then not
committed). Two things in that path assume what gloo's and NCCL's Works do,
and :class:`~asyncdist.torch_backend.work.TorchWork` does not:

* ``wait()`` must not raise for a failed operation. If it raises,
  ``_ManagedWork.wait`` returns before it has chained the callbacks, and
  torchft's DDP communication hook then fails an assertion (``fut._fut``),
  which aborts the backward pass instead of skipping the step. So here
  ``wait()`` returns False for a failed operation; the error is in the
  future, in :meth:`TorchftWork.exception` and in the process group's
  ``errored()``.
* the future must be complete when ``wait()`` returns. torchft chains one
  callback per link in a loop whose callbacks close over the loop's
  variable, which is right only for a future already complete when the
  callback is added. A TorchWork's future is completed on another thread
  just after the operation ends (see :mod:`asyncdist.torch_backend.work`),
  so ``wait()`` here also waits for that.

Everything else is the TorchWork's. Thread affinity: any thread but the
asyncdist loop's.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import torch.distributed as tdist

from ..engine.progress import Awaited
from ..torch_backend.work import TorchWork

__all__ = ["TorchftWork"]


class TorchftWork(tdist.Work):
    """A :class:`~asyncdist.torch_backend.work.TorchWork` whose ``wait`` suits torchft's Manager.

    Args:
        work: the running operation.
    """

    def __init__(self, work: TorchWork) -> None:
        super().__init__()
        self._work = work

    def __repr__(self) -> str:
        return f"<TorchftWork {self._work!r}>"

    def wait(self, timeout: timedelta | float | None = None) -> bool:
        """Block until the operation and its future are complete; True if it succeeded.

        Returns:
            False if the operation failed (its error: :meth:`exception`).

        Raises:
            OperationTimeoutError: not complete within ``timeout`` (it goes on).
            WrongThreadError: called on the asyncdist loop's thread.
        """
        try:
            self._work.wait(timeout)
        except (Exception, asyncio.CancelledError):  # the operation's error, whatever it is (not only asyncdist's)
            if not self._work.is_completed():
                raise  # this wait gave up (or was refused); the operation goes on
        try:
            self._work.get_future().wait()  # completed by another thread once the operation is
        except Exception:  # noqa: BLE001 (the operation's error, which exception() keeps)
            pass
        return self._work.is_success()

    def get_future(self) -> Any:
        """The TorchWork's ``torch.futures.Future`` (failed with the operation's error)."""
        return self._work.get_future()

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def is_success(self) -> bool:
        return self._work.is_success()

    def exception(self) -> BaseException | None:
        """The operation's asyncdist error, or None (also while it runs)."""
        return self._work.exception()

    def waiting(self) -> tuple[str, Awaited] | None:
        """Where the running operation is and the peers it awaits; None once done."""
        return self._work.waiting()

    @property
    def future(self) -> Any:
        """The operation's asyncio future (loop thread only; None until it starts)."""
        return self._work.future

    def result(self) -> list:
        return self._work.result()

    def source_rank(self) -> int:
        return self._work.source_rank()

    _source_rank = source_rank  # what torch's recv() calls

    def synchronize(self) -> None:
        self._work.synchronize()

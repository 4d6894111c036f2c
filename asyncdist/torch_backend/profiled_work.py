"""The backend's Work while a torch profiler runs: its event ends with the operation.

torch's c10d records a gloo operation as an asynchronous profiler event that
opens when the operation starts and closes when its Work completes, before
``wait()`` returns. :class:`ProfiledWork` does the same for an asyncdist
operation: the :class:`~asyncdist._profiling.AsyncEvent` the backend opened
on the calling thread is closed, on the event closer's thread, once the
operation's future is done, and :meth:`ProfiledWork.wait` returns only after
that, so an event is complete when the profiler stops after a ``wait()``.

:func:`started` starts an operation and returns its Work: a
:class:`ProfiledWork` while a profiler runs, else a plain
:class:`~.work.TorchWork`, at the cost of one C call. Events are named as
gloo's (:data:`EVENT_NAMES`).

Thread affinity: made on the loop thread (where the operation's future
lives); used from any thread, as TorchWork is.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Coroutine, Sequence

from .._profiling import AsyncEvent, open_event
from ..group.work import Work
from .work import TorchWork

if TYPE_CHECKING:
    from torch import Tensor

    from ..loop.thread import LoopThread

__all__ = ["EVENT_NAMES", "ProfiledWork", "started"]

#: The profiler event's name where gloo's differs from the operation's (gloo's
#: ``gloo:all_gather`` for all_gather_into_tensor, ...), so tools that read
#: c10d events find the same names with the ``asyncdist:`` prefix.
EVENT_NAMES = {
    "all_reduce_coalesced": "all_reduce",
    "all_gather_coalesced": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "all_to_all_single": "all_to_all",
    "recv_anysource": "recvAnySource",
}


def started(portal: LoopThread, what: str, start: Callable[[], Work], outputs: list[Tensor],
            inputs: Sequence[Tensor], run_now: Callable[[], Coroutine[Any, Any, Any]] | None = None) -> TorchWork:
    """Post ``start`` to the loop thread (:meth:`TorchWork.post`) and return the
    operation's Work; while a torch profiler runs, the operation is the
    asynchronous event ``asyncdist:<name>``, ``name`` being gloo's for the
    operation ``what`` (:data:`EVENT_NAMES`), with the shapes of ``inputs``.

    ``run_now``, for a call that torch waits on at once, is the operation's
    coroutine function: outside a profiler it is run to completion here
    instead (:meth:`TorchWork.ran`).

    Any thread but the loop's.
    """
    event = open_event(EVENT_NAMES.get(what, what), inputs)  # None unless profiling: one C call
    if event is None:
        if run_now is not None:
            return TorchWork.ran(portal, run_now, what, outputs)
        return TorchWork.post(portal, start, outputs, what)
    return ProfiledWork(outputs, portal, event).post_start(start, what)


class ProfiledWork(TorchWork):
    """A :class:`~.work.TorchWork` whose profiler event closes when the operation completes.

    Args:
        outputs: as for TorchWork.
        portal: the loop thread the operation is posted to (:meth:`TorchWork.post_start`).
        event: the operation's open event; this Work closes it.
    """

    def __init__(self, outputs: list, portal: LoopThread, event: AsyncEvent) -> None:
        super().__init__(None, outputs, portal)
        self._event = event

    def _bind(self, work: Work) -> None:
        # The thread that runs the loop: the future cannot complete before this callback is in place.
        work.future.add_done_callback(lambda _: self._event.end_elsewhere())
        super()._bind(work)

    def _fail_start(self, error: BaseException) -> None:
        self._event.end_elsewhere()  # it did not start: its event ends at once
        super()._fail_start(error)

    def wait(self, timeout: timedelta | float | None = None) -> bool:
        """As :meth:`TorchWork.wait`, and the operation's event is closed when it returns
        (or raises the operation's error)."""
        try:
            return super().wait(timeout)
        finally:
            if self.is_completed():  # not for a wait that timed out: the operation goes on
                # Closed here too, not only by the loop's callback: this wait
                # must not depend on the loop turning again.
                self._event.end_elsewhere()
                self._event.wait_ended()

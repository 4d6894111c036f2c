"""The backend's Work while a torch profiler runs: its event ends with the operation.

torch's c10d records a gloo operation as an asynchronous profiler event that
opens when the operation starts and closes when its Work completes, before
``wait()`` returns. :class:`ProfiledWork` does the same for an asyncdist
operation: the :class:`~asyncdist._profiling.AsyncEvent` the backend opened
on the calling thread is closed, on the event closer's thread, once the
operation's future is done, and :meth:`ProfiledWork.wait` returns only after
that, so an event is complete when the profiler stops after a ``wait()``.

Made only while a profiler runs; otherwise the backend returns a plain
:class:`~.work.TorchWork` and none of this costs anything.

Thread affinity: made on the loop thread (where the operation's future
lives); used from any thread, as TorchWork is.
"""

from __future__ import annotations

from datetime import timedelta

from .._profiling import AsyncEvent
from ..group.work import Work
from .work import TorchWork

__all__ = ["ProfiledWork"]


class ProfiledWork(TorchWork):
    """A :class:`~.work.TorchWork` whose profiler event closes when the operation completes.

    Args:
        work: the running operation.
        outputs: as for TorchWork.
        event: the operation's open event; this Work closes it.
    """

    def __init__(self, work: Work, outputs: list, event: AsyncEvent) -> None:
        super().__init__(work, outputs)
        self._event = event
        # Loop thread: the future cannot complete before this callback is in place.
        work.future.add_done_callback(lambda _: event.end_elsewhere())

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

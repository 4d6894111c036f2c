"""torch.profiler sees asyncdist: one event ``asyncdist:<op>`` per call.

Under ``torch.profiler.profile()`` (or the legacy autograd profiler) every
collective and point-to-point call made through the facade or the torch
backend records one event named ``asyncdist:<op>`` (gloo's are
``gloo:<op>``). With ``record_shapes=True`` the event carries the shapes of
the call's input tensors, as torch's own operators do.

Two kinds of event:

* :func:`profiled` (the facade): a synchronous event around the call on the
  calling thread, the whole call for a blocking one, its start for
  ``async_op=True``, ``isend`` and ``irecv``.
* :func:`open_event` (the torch backend): an asynchronous event, as torch's
  c10d records gloo's. It opens on the calling thread when the operation
  starts and closes when the operation completes, on a thread of its own
  (:meth:`AsyncEvent.end_elsewhere`); torch marks an event that ends on
  another thread than it began as asynchronous (``FunctionEvent.is_async``),
  which is what tools that read c10d events expect. Python cannot call
  RecordFunction's ``_setAsync``, which gloo's C++ uses; the thread is how
  the event says it. torch's ``_call_end_callbacks_on_jit_fut`` ends the
  record with the profiler's thread-local state of the opening thread, so
  the event is kept although the closing thread has none.

Cost when no profiler runs: a look into ``sys.modules`` and, with torch
imported, ``torch.autograd._profiler_enabled()`` (a C call). Nothing else.
Never imports torch.

Any thread but the loop's (the facade's and the backend's callers).
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence, TypeVar

__all__ = ["profiled", "open_event", "AsyncEvent"]

R = TypeVar("R")

# The one thread that closes asynchronous events, in completion order. The
# executor starts it at the first event's end, so only while a profiler runs;
# made here, not on first use, where two threads (the loop's done-callback and
# a waiting one) could each make one and close an event twice at once.
_closer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="asyncdist-profiler")


def profiled(op: str, tensors: Sequence[Any], call: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
    """``call(*args, **kwargs)``, recorded as the event ``asyncdist:<op>`` if a torch profiler is on.

    Args:
        op: the operation's name ("all_reduce", "isend").
        tensors: its inputs; the torch tensors among them give the event's input shapes.
    """
    torch = sys.modules.get("torch")
    autograd = getattr(torch, "autograd", None)  # None while torch is still being imported
    if torch is None or autograd is None or not autograd._profiler_enabled():
        return call(*args, **kwargs)
    inputs = [t for t in tensors if isinstance(t, torch.Tensor)]
    handle = torch._C._autograd._record_function_with_args_enter(f"asyncdist:{op}", *inputs)
    try:
        return call(*args, **kwargs)
    finally:
        torch._C._autograd._record_function_with_args_exit(handle)


def open_event(op: str, tensors: Sequence[Any]) -> AsyncEvent | None:
    """Open the asynchronous event ``asyncdist:<op>`` if a torch profiler is on, else None.

    The caller ends it with :meth:`AsyncEvent.end_elsewhere` when the
    operation completes, or fails to start.

    Args:
        op: the operation's name, as gloo's events have it ("all_reduce", "recvAnySource").
        tensors: its inputs; the torch tensors among them give the event's input shapes.
    """
    torch = sys.modules.get("torch")
    autograd = getattr(torch, "autograd", None)  # None while torch is still being imported
    if torch is None or autograd is None or not autograd._profiler_enabled():
        return None  # the common case: checked inline, one C call and no more
    return AsyncEvent(torch, op, tensors)


class AsyncEvent:
    """A profiler event open from its operation's start to its completion.

    Opened on the calling thread (the profiler's state is that thread's).
    """

    __slots__ = ("_ended", "_closed")

    def __init__(self, torch: Any, op: str, tensors: Sequence[Any]) -> None:
        inputs = [t for t in tensors if isinstance(t, torch.Tensor)]
        handle = torch._C._autograd._record_function_with_args_enter(f"asyncdist:{op}", *inputs)
        self._ended = torch.futures.Future()
        # Ends the record when _ended completes, under this thread's profiler state.
        self._closed = torch.ops.profiler._call_end_callbacks_on_jit_fut._RecordFunction(handle, self._ended)

    def end_elsewhere(self) -> None:
        """Close the event on the closing thread, soon (any thread; never blocks;
        once, however many times it is called)."""
        _closer.submit(self._end)

    def _end(self) -> None:
        # The closing thread only, one at a time: nothing else completes _ended.
        if not self._ended.done():
            self._ended.set_result(None)

    def wait_ended(self) -> None:
        """Block until the event is closed (after :meth:`end_elsewhere`)."""
        self._closed.wait()

"""The caller's streams, and the results a later ``wait()`` must order after.

torch's rule for device work: an operation is ordered after the work already
queued on the *calling* thread's current stream, and ``Work.wait()`` makes
the *waiting* thread's current stream wait for the result, without blocking
the host. Current streams are per thread in torch and CuPy, and asyncdist
runs every operation on its event loop's thread, so this module carries the
caller's streams across:

* :func:`caller_context` runs on the user's thread when a blocking-facade
  call is handed to the loop in another thread, or starts operations that
  go on after it returns (:class:`~asyncdist.loop.thread.LoopThread`); it
  snapshots the current stream of every live adapter into a context
  variable of a copied context, and the loop runs the call in that context,
  so the operation's task sees it. When no GPU library is in use it returns
  None. A call run in the calling thread needs no snapshot: there the
  thread's current streams are the caller's.
* :func:`caller_stream` (loop thread) is that snapshot's stream, else the
  loop thread's own current stream (the await API's caller *is* the loop
  thread).
* :func:`note_result` (loop thread) records the events a device operation's
  result is complete after, keyed by its future (the task running it, by
  default); :func:`after_wait` (the waiting thread, from ``Work.wait()``)
  makes that thread's current streams wait for them.

The notes are weakly keyed: they go when the future goes. An await-API
caller that runs many operations in one task keeps only the latest note.
"""

from __future__ import annotations

import asyncio
import contextvars
import weakref
from typing import Any, Hashable, Iterable

from .device import DeviceAdapter, live_adapters

__all__ = ["caller_context", "caller_stream", "note_result", "after_wait", "Completion"]

#: (adapter, device, event): the result on ``device`` is complete after ``event``.
Completion = tuple[DeviceAdapter, Hashable, Any]

_CALLER_STREAMS: contextvars.ContextVar[dict[tuple[DeviceAdapter, Hashable], Any] | None] = contextvars.ContextVar(
    "asyncdist_caller_streams", default=None
)

_RESULTS: weakref.WeakKeyDictionary[asyncio.Future, tuple[Completion, ...]] = weakref.WeakKeyDictionary()


def caller_context() -> contextvars.Context | None:
    """A copy of the calling thread's context holding its current device streams.

    Any thread (the user's, before handing a call to the loop thread).

    Returns:
        None when no device library is in use (the caller then lets asyncio
        copy the context as usual).
    """
    adapters = live_adapters()
    if not adapters:
        return None
    streams: dict[tuple[DeviceAdapter, Hashable], Any] = {}
    for adapter in adapters:
        streams.update(adapter.capture())
    context = contextvars.copy_context()
    context.run(_CALLER_STREAMS.set, streams)
    return context


def caller_stream(adapter: DeviceAdapter, device: Hashable) -> Any:
    """The stream an operation on ``device`` must be ordered after (loop thread).

    The stream captured from the blocking caller's thread if there is one,
    else the current stream of the calling (loop) thread.
    """
    captured = _CALLER_STREAMS.get()
    if captured is not None:
        stream = captured.get((adapter, device))
        if stream is not None:
            return stream
    return adapter.current_stream(device)


def note_result(completions: Iterable[Completion], future: asyncio.Future | None = None) -> None:
    """Record that the result of ``future``'s operation is complete after ``completions``.

    Loop thread. ``future`` defaults to the running task (what the facade's
    ``Work`` wraps for collectives).
    """
    key = future if future is not None else asyncio.current_task()
    if key is not None:
        _RESULTS[key] = tuple(completions)


def after_wait(future: asyncio.Future) -> None:
    """Make the calling thread's current streams wait for ``future``'s device result.

    Called by ``Work.wait()`` once the future is done, on the waiting thread;
    does nothing for host operations. Never blocks the host.
    """
    if not _RESULTS:
        return
    completions = _RESULTS.get(future)
    if not completions:
        return
    for adapter, device, event in completions:
        adapter.stream_wait(adapter.current_stream(device), event)

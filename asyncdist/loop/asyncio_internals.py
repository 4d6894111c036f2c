"""Every private part of asyncio that asyncdist relies on, and why.

A blocking call turns its loop one iteration at a time in the calling thread
(:class:`~asyncdist.loop.turns.Driver`): that is what keeps a small facade
call near the await API's latency (an 8-byte all_reduce on 2 ranks: 210-260
us per call spinning this way, 370-430 us sleeping in ``run_forever``; see
:mod:`asyncdist.loop.turns`). asyncio has no public API to run one
iteration, to run an iteration that polls instead of sleeping, or to mark a
loop as running in a thread without ``run_forever``. The few private names
that do it live here and nowhere else, each with its reason; the test
``tests/loop/test_asyncio_internals.py`` fails, naming the attribute and the
Python version, when one is missing or has changed shape.

Checked on CPython 3.11.7 (run); the same lines of ``Lib/asyncio/base_events.py``
(``_run_once``'s ``if self._ready or self._stopping: timeout = 0``,
``is_running()`` as ``self._thread_id is not None``) are in 3.12.

**uvloop** (``ASYNCDIST_LOOP=uvloop``) is not an ``asyncio.BaseEventLoop``
and has none of the loop internals: :func:`can_step` is False for it, and
the Driver runs a call as a Task under the public ``run_forever`` instead.
The two functions of ``asyncio.events`` below are the ones uvloop itself
uses to mark its loop running, so they hold for both loops.

Nothing here is on a per-message path: :func:`turn` runs once per loop
iteration of a blocking call, :func:`enter` and :func:`leave` once per call.
"""

from __future__ import annotations

import asyncio
import threading
from asyncio import events
from typing import Any

__all__ = ["running_loop_or_none", "set_running_loop", "can_step", "missing", "enter", "leave", "turn"]

#: This thread's running loop, or None: ``asyncio.events._get_running_loop``
#: (listed in ``asyncio.events.__all__``, "intended to be used by event
#: loops"). The public ``asyncio.get_running_loop()`` raises RuntimeError when
#: none runs, which is the usual case of a blocking call: raising and catching
#: it would cost on every call. Used by :meth:`LoopThread.run` (and ``stop``)
#: to refuse a call made on the loop's own thread.
running_loop_or_none = events._get_running_loop

#: Make ``loop`` (or None) this thread's running loop, as ``run_forever`` does:
#: ``asyncio.events._set_running_loop`` (also in ``asyncio.events.__all__``).
#: A coroutine stepped by the Driver calls ``asyncio.get_running_loop()``.
set_running_loop = events._set_running_loop

# What an asyncio loop must have for turn(), enter() and leave() to work on it.
_LOOP_INTERNALS = ("_run_once", "_stopping", "_thread_id")


def missing(loop: asyncio.AbstractEventLoop) -> list[str]:
    """The internals :func:`turn`, :func:`enter` and :func:`leave` need that
    ``loop`` lacks (empty for asyncio's own loops on the Pythons named above)."""
    return [name for name in _LOOP_INTERNALS if not hasattr(loop, name)]


def can_step(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether ``loop`` can be turned one iteration at a time (:func:`turn`):
    an ``asyncio.BaseEventLoop`` with every internal of :func:`missing`; False
    for uvloop, and for an asyncio whose internals changed (the Driver then
    runs calls as Tasks: slower, still correct)."""
    return isinstance(loop, asyncio.BaseEventLoop) and not missing(loop)


def enter(loop: Any) -> None:
    """Mark ``loop`` running in this thread, as ``run_forever`` does before its
    first iteration: ``loop.is_running()`` is True (``_thread_id``, which
    ``is_running`` reads and debug mode's thread checks compare) and
    ``asyncio.get_running_loop()`` returns it. Pair with :func:`leave`."""
    loop._thread_id = threading.get_ident()
    set_running_loop(loop)


def leave(loop: Any) -> None:
    """Undo :func:`enter`, as ``run_forever`` does when it returns."""
    set_running_loop(None)
    loop._thread_id = None


def turn(loop: Any, poll: bool) -> None:
    """Run one iteration of ``loop`` (``BaseEventLoop._run_once``): wait for I/O
    or the next timer, then run every callback that is ready.

    Args:
        poll: don't sleep: look at I/O without waiting (the spin of a blocking
            call). ``_run_once`` waits 0 s while ``_stopping`` is set, the flag
            ``loop.stop()`` sets to end ``run_forever`` after this iteration;
            it is cleared afterwards either way, so a ``stop()`` made by a
            callback during the turn does not outlive it (it is meant for
            ``run_forever``, which the Driver is not).
    """
    loop._stopping = poll
    loop._run_once()
    loop._stopping = False

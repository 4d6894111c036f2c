"""Which event loop a rank runs: uvloop's or asyncio's own.

uvloop is faster where one thread runs a loop for good (the await API, the
benchmarks). A :class:`~asyncdist.loop.thread.LoopThread` asks for asyncio's
by default: only that loop can be turned one iteration at a time from the
calling thread (:mod:`~asyncdist.loop.turns`). ``ASYNCDIST_LOOP`` overrides
either default.
"""

from __future__ import annotations

import asyncio

from .. import settings

__all__ = ["new_event_loop", "LOOP_ENV"]

#: "asyncio" or "uvloop": which event loop to use (default: uvloop where a
#: loop runs in one thread for good, asyncio's for a LoopThread).
LOOP_ENV = settings.name_of("loop")


def new_event_loop(default: str = "uvloop") -> asyncio.AbstractEventLoop:
    """A new event loop: ``ASYNCDIST_LOOP``'s choice, else ``default``
    ("uvloop": uvloop's when installed; "asyncio": the standard one)."""
    choice = settings.refresh().loop or default
    if choice != "asyncio":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()

"""Counting the Python functions a stretch of code enters, with ``sys.setprofile``.

A :class:`CallCounter` is a profile function that tallies, per code object,
the ``"call"`` events (a Python function's frame entered: a plain call, and
also each time a coroutine or generator is resumed, which is the work a
suspended ``await`` chain costs) and the ``"c_call"`` events (a builtin or C
function called), the latter keyed by the code that made the call. Nothing
is classified while counting: the hot path is one dict update per event, and
where the code lives (:func:`origin`) is worked out once, afterwards.

It knows nothing of asyncdist's internals: it sees only code objects and
their file names, so it counts whatever code is under it, old or new.
Counts are exact for the code between ``__enter__`` and ``__exit__``: the
counter's own exit is taken out of them.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections import Counter
from types import CodeType, FrameType
from typing import Any, Callable

import asyncdist

__all__ = ["CallCounter", "ORIGINS", "origin"]

#: Where a called function's code lives, in the order tables show them.
ORIGINS = ("asyncdist", "asyncio", "other")

# The package imported, wherever it is (a copy of this module run from elsewhere counts it too).
_LIBRARY = os.path.dirname(os.path.abspath(asyncdist.__file__)) + os.sep
_ASYNCIO = os.path.dirname(os.path.abspath(asyncio.__file__)) + os.sep
# The benchmark's own modules drive the operations; they are not the library's work.
_BENCH = os.path.join(_LIBRARY, "bench") + os.sep


def origin(code: CodeType) -> str:
    """Where ``code`` lives: ``"asyncdist"`` (the library, less its benchmarks),
    ``"asyncio"`` (the standard library's asyncio package) or ``"other"``."""
    path = os.path.abspath(code.co_filename)
    if path.startswith(_LIBRARY) and not path.startswith(_BENCH):
        return "asyncdist"
    return "asyncio" if path.startswith(_ASYNCIO) else "other"


def library_file(code: CodeType) -> str | None:
    """``code``'s file relative to the directory holding the ``asyncdist`` package
    (``asyncdist/engine/engine.py``), or None if it is not the library's."""
    if origin(code) != "asyncdist":
        return None
    return os.path.relpath(os.path.abspath(code.co_filename), os.path.dirname(_LIBRARY.rstrip(os.sep)))


class CallCounter:
    """Counts ``"call"`` and ``"c_call"`` profile events while entered.

    ``with counter:`` profiles the calling thread. For work that other threads
    do too, :meth:`profile_new_threads` first: threads started after it are
    profiled from their start, and count only while the counter is entered.
    Entering again adds to the counts.

    Example::

        counter = CallCounter()
        with counter:
            json.dumps([1, 2])
        counter.by_origin()   # {"asyncdist": 0, "asyncio": 0, "other": ...}
    """

    def __init__(self) -> None:
        #: "call" events by the entered function's code.
        self.calls: Counter[CodeType] = Counter()
        #: "c_call" events by the calling function's code.
        self.c_calls: Counter[CodeType] = Counter()
        self._active = False
        self.event = self._make_event()

    def _make_event(self) -> Callable[[FrameType, str, Any], None]:
        calls, c_calls = self.calls, self.c_calls

        def event(frame: FrameType, what: str, arg: Any) -> None:
            if not self._active:
                return
            if what == "call":
                calls[frame.f_code] += 1
            elif what == "c_call":
                c_calls[frame.f_code] += 1

        return event

    def profile_new_threads(self) -> None:
        """Profile every thread started from now on (they count while entered).
        Undo with ``threading.setprofile(None)``; threads already started keep it."""
        threading.setprofile(self.event)

    def __enter__(self) -> CallCounter:
        sys.setprofile(self.event)
        self._active = True
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._active = False
        sys.setprofile(None)
        # This method's own frame was entered while counting: not the counted code's work.
        own = CallCounter.__exit__.__code__
        self.calls[own] -= 1
        if not self.calls[own]:
            del self.calls[own]

    def by_origin(self, c_calls: bool = False) -> dict[str, int]:
        """The counts of calls (or, with ``c_calls``, of C calls, by their caller's
        place) summed by :func:`origin`, every key of :data:`ORIGINS` present."""
        totals = dict.fromkeys(ORIGINS, 0)
        for code, count in (self.c_calls if c_calls else self.calls).items():
            totals[origin(code)] += count
        return totals

    def library_files(self) -> list[str]:
        """The library's source files whose functions were entered, sorted."""
        return sorted({f for f in map(library_file, self.calls) if f is not None})

"""Writing the flight recorder to disk: on failure, on SIGUSR1, on demand and when a peer asks.

A dump is one JSON file per rank, ``asyncdist-trace-rank<R>.json``, in
``ASYNCDIST_TRACE_DIR`` (the launcher sets it for its workers; unset, a
failure writes nothing and an on-demand dump goes to a fresh temporary
folder). ``asyncdist-trace analyze`` reads a folder of them.

Format version 2 adds ``stacks``: every thread's Python stack
(:mod:`~asyncdist.flight.stacks`), captured at each failure, SIGUSR1 and
peer's question, the last :data:`KEPT_CAPTURES` kept, oldest first. Version
1 dumps have none; readers take a missing ``stacks`` as empty.

A failure (an operation timeout, a lost peer, ranks that disagree) first
*freezes* the record (each open operation notes the peers it waits on,
before the failure withdraws its receives), then writes the dump at once;
the other operations that fail in the same loop turn rewrite it once at
the end of the turn.

A rank is also *asked* to dump, by a peer that is in trouble: a hang
warning's question (:class:`~asyncdist.wire.control.Where`) or a peer's
failed call (an ABORT). It captures its stacks and writes its dump then
(:meth:`Dumps.on_asked`), so that a rank stuck in its own code, which fails
nothing itself, leaves a dump that says where it is. Many questions in a
row (every waiting peer asks) capture and write once per
:data:`ASKED_INTERVAL`.

SIGUSR1 dumps every live engine of the process (the handler is installed
from the main thread, and only where SIGUSR1 still has its default action).

Loop thread, except :func:`install_sigusr1` (main thread).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import signal
import socket
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from .. import settings
from . import stacks
from .recorder import Recorder, as_dict

__all__ = ["Dumps", "TRACE_DIR_ENV", "dump_file", "install_sigusr1"]

log = logging.getLogger("asyncdist.trace")

TRACE_DIR_ENV = settings.name_of("trace_dir")
FORMAT_VERSION = 2
#: Stack captures a dump keeps (the newest): the hang's, and the failure's that may follow.
KEPT_CAPTURES = 4
#: Seconds within which a further question from a peer captures and writes nothing new.
ASKED_INTERVAL = 1.0

_LIVE: weakref.WeakSet[Dumps] = weakref.WeakSet()  # what SIGUSR1 dumps


def dump_file(directory: str | os.PathLike[str], rank: int) -> Path:
    """The path of rank ``rank``'s dump in ``directory``."""
    return Path(directory) / f"asyncdist-trace-rank{rank}.json"


class Dumps:
    """When and where one engine's recorder is written.

    Args:
        recorder: the engine's recorder.
        world_size, job_id: written into the dump, for the analyzer.
        directory: where failures dump (None: ``ASYNCDIST_TRACE_DIR``, or nowhere).
    """

    def __init__(self, recorder: Recorder, world_size: int, job_id: str, directory: str | None = None) -> None:
        self.recorder = recorder
        self.world_size = world_size
        self.job_id = job_id
        self.directory = directory if directory is not None else settings.current().trace_dir
        self.loop: asyncio.AbstractEventLoop | None = None
        self._reasons: list[str] = []  # failures of this loop turn, the first already dumped
        self.stacks: list[dict[str, Any]] = []  # the captures kept, oldest first
        self._asked_at = -math.inf  # when a peer's question last captured (recorder clock)
        _LIVE.add(self)

    def snapshot(self, reason: str) -> dict[str, Any]:
        """The dump's content (loop thread)."""
        recorder = self.recorder
        return {
            "format": "asyncdist-trace", "version": FORMAT_VERSION, "rank": recorder.rank,
            "world_size": self.world_size, "job_id": self.job_id, "host": socket.gethostname(), "pid": os.getpid(),
            "reason": reason, "wall_time": time.time(), "clock_time": recorder.clock(),
            "capacity": recorder.capacity, "recorded": recorder.recorded,
            "lost": {str(rank): why for rank, why in recorder.lost.items()},
            "heard": {str(rank): answer for rank, answer in recorder.heard.items()},
            "entries": [as_dict(entry) for entry in recorder.entries()], "stacks": self.stacks,
        }  # fmt: skip

    def write(self, path: str | os.PathLike[str] | None = None, reason: str = "on demand") -> Path:
        """Write the dump now; return its path (loop thread).

        Args:
            path: a file, or a folder to write ``asyncdist-trace-rank<R>.json``
                into (None: ``ASYNCDIST_TRACE_DIR``, else a new temporary folder).
        """
        if path is None:
            path = self.directory or tempfile.mkdtemp(prefix="asyncdist-trace-")
        target = Path(path)
        if target.is_dir() or not target.suffix:
            target = dump_file(target, self.recorder.rank)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        partial.write_text(json.dumps(self.snapshot(reason)))
        partial.replace(target)  # a reader never sees half a dump
        return target

    def on_failure(self, reason: str) -> None:
        """A failure: freeze what the open operations wait on, capture every
        thread's stack and dump now (into ``directory``; nothing when there is none). The failures that follow in
        this loop turn (every operation that depended on a lost peer) rewrite
        it once at the end of the turn. Now, not later: the facade's caller may
        get the error and end the process before the loop turns again."""
        self.recorder.freeze()  # for a dump on demand later, too
        self._dump(reason)

    def on_asked(self, reason: str) -> None:
        """A peer in trouble asks this rank where it is (a hang warning's
        question, an ABORT): capture the stacks and dump as for a failure,
        at most once per :data:`ASKED_INTERVAL` (every waiting peer asks)."""
        now = self.recorder.clock()
        if self.recorder.capacity == 0 or now - self._asked_at < ASKED_INTERVAL:
            return
        self._asked_at = now
        self.recorder.freeze()
        self._dump(reason)

    def capture_stacks(self, reason: str) -> None:
        """Capture every thread's stack now and keep it for the dumps (the newest :data:`KEPT_CAPTURES`)."""
        self.stacks = [*self.stacks, stacks.capture(reason, self.recorder.clock())][-KEPT_CAPTURES:]

    def _dump(self, reason: str) -> None:
        """Capture the stacks and write the dump, once per loop turn (the
        turn's other reasons rewrite it once at its end)."""
        if self.recorder.capacity == 0:
            return
        if self._reasons:  # this turn already dumped: once more at its end
            self._reasons.append(reason)
            return
        self.capture_stacks(reason)
        if self.directory is not None:
            self._write_logged(reason)
        try:
            asyncio.get_running_loop().call_soon(self._rewrite)
        except RuntimeError:
            return  # no loop runs (a test's bare recorder): no turn to coalesce
        self._reasons.append(reason)

    def _rewrite(self) -> None:
        reasons, self._reasons = self._reasons, []
        if len(reasons) > 1 and self.directory is not None:
            try:
                self.write(reason="; ".join(dict.fromkeys(reasons)))
            except OSError:
                pass  # the first write of this turn was logged

    def _on_signal(self) -> None:
        self.recorder.freeze()
        self.capture_stacks("SIGUSR1")
        self._write_logged("SIGUSR1")

    def _write_logged(self, reason: str) -> None:
        try:
            path = self.write(reason=reason)
        except OSError as exc:
            log.warning("rank %d: could not write the flight recorder's dump: %s", self.recorder.rank, exc)
            return
        log.warning("rank %d: flight recorder dumped to %s (%s)", self.recorder.rank, path, reason)


def install_sigusr1() -> bool:
    """Make SIGUSR1 dump every live engine of this process (main thread; once).

    Returns:
        True if the handler is installed (now or before); False where it cannot
        be (not the main thread, or SIGUSR1 already has a handler of the user's).
    """
    if not hasattr(signal, "SIGUSR1") or threading.current_thread() is not threading.main_thread():
        return False
    current = signal.getsignal(signal.SIGUSR1)
    if current is _on_sigusr1:
        return True
    if current is not signal.SIG_DFL:
        return False
    signal.signal(signal.SIGUSR1, _on_sigusr1)
    return True


def _on_sigusr1(signum: int, frame: Any) -> None:
    """Ask each live engine's loop to dump (a signal handler must not touch loop state)."""
    for dumps in list(_LIVE):
        loop = dumps.loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(dumps._on_signal)

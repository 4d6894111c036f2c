"""Every thread's Python stack, captured for a dump, and where a rank's user code is.

A rank that is behind is usually stuck in its own code (a data loader, a
sleep, a lock), not in asyncdist; its flight record only says which call it
made last. Its stack says where it is. The facade runs the event loop on a
thread of its own, so the loop can capture the user's thread while that
thread is busy elsewhere: :func:`capture` reads ``sys._current_frames()``
(every thread's innermost frame, a snapshot the interpreter takes under its
lock) and writes each frame as file, line, function, the line's source and
its *origin*:

* ``user``: the program's own code (anything not below);
* ``asyncdist``: a file of this package;
* ``library``: the standard library, site-packages, and frozen modules.

Origins are decided here, in the process that ran the code, where the
paths mean something; the analyzer on another machine only reads them.

:func:`locate` picks the thread that matters (:func:`chosen`: the main
thread, unless it is the capturing loop's own thread with no asyncdist call
of the user's running there, as in the await API; then the first other
thread in user code) and its innermost ``user`` frame, and says which
asyncdist call runs inward of it, if any. :func:`where_text` puts that in
words::

    main thread is in job.py:7 in main (time.sleep(30)), outside any asyncdist call

Plain functions, no state; capture runs on the loop thread, on failure and
hang paths only (a few milliseconds: one walk of each stack, source lines
read once and cached by :mod:`linecache`, each file's origin decided once).
"""

from __future__ import annotations

import functools
import io
import linecache
import os
import sys
import sysconfig
import threading
import tokenize
from pathlib import Path
from types import FrameType
from typing import Any, Iterator

__all__ = ["capture", "chosen", "user_thread", "locate", "where_text", "origin", "Location"]

# A thread's innermost frames kept (deep recursion would make a dump of megabytes).
MAX_FRAMES = 48
# Characters of a frame's source line kept (a generated line may be very long).
_CODE_CHARS = 200
USER, ASYNCDIST, LIBRARY = "user", "asyncdist", "library"

_PACKAGE = str(Path(__file__).resolve().parent.parent) + os.sep
_LIBRARIES = tuple(
    sorted({str(Path(p).resolve()) + os.sep for key, p in sysconfig.get_paths().items()
            if key in ("stdlib", "platstdlib", "purelib", "platlib")})
)  # fmt: skip


@functools.lru_cache(maxsize=4096)
def origin(filename: str) -> str:
    """Whose code ``filename`` is: ``"user"``, ``"asyncdist"`` or ``"library"``.

    Remembered per file name: resolving a path costs a system call per
    component, and a capture asks for every frame of every thread."""
    if filename.startswith("<"):  # <frozen runpy> is the library's; <string>, <stdin> the user's
        return LIBRARY if filename.startswith("<frozen") else USER
    path = os.path.realpath(filename)
    if path.startswith(_PACKAGE):
        return ASYNCDIST
    if path.startswith(_LIBRARIES):
        return LIBRARY
    return USER


def _frames(innermost: FrameType) -> Iterator[FrameType]:
    frame: FrameType | None = innermost
    while frame is not None:
        yield frame
        frame = frame.f_back


def _source(filename: str, line: int) -> str:
    """Line ``line`` of ``filename``, without its comment, at most :data:`_CODE_CHARS` characters."""
    text = linecache.getline(filename, line).strip()
    if "#" in text:
        try:  # a line that does not end its statement tokenizes up to its end, then raises
            for token in tokenize.generate_tokens(io.StringIO(text).readline):
                if token.type == tokenize.COMMENT:
                    text = text[: token.start[1]].rstrip()
                    break
        except (tokenize.TokenError, SyntaxError):
            pass
    return text[:_CODE_CHARS]


def _frame(frame: FrameType) -> dict[str, Any]:
    code = frame.f_code
    line = frame.f_lineno or 0
    return {"file": code.co_filename, "line": line, "function": getattr(code, "co_qualname", code.co_name),
            "code": _source(code.co_filename, line), "origin": origin(code.co_filename)}  # fmt: skip


def capture(reason: str, clock: float) -> dict[str, Any]:
    """Every thread's stack now, as a dump holds it (any thread; it marks itself ``loop``).

    Args:
        reason: why it was taken (a peer's hang question, a failure).
        clock: the recorder's clock now, so the capture lines up with the record.

    Returns:
        ``{"reason", "time", "cwd", "threads": [{"name", "ident", "main",
        "loop", "daemon", "frames": [{"file", "line", "function", "code",
        "origin"}, ...]}]}``, frames outermost first (as in a traceback),
        at most :data:`MAX_FRAMES` innermost ones per thread.
    """
    me = threading.get_ident()
    main = threading.main_thread().ident
    by_ident = {thread.ident: thread for thread in threading.enumerate()}
    threads = []
    for ident, innermost in sys._current_frames().items():
        thread = by_ident.get(ident)
        frames = [_frame(frame) for _, frame in zip(range(MAX_FRAMES), _frames(innermost))]
        frames.reverse()
        threads.append({"name": thread.name if thread is not None else f"thread {ident}", "ident": ident,
                        "main": ident == main, "loop": ident == me,
                        "daemon": bool(thread is not None and thread.daemon), "frames": frames})  # fmt: skip
    threads.sort(key=lambda t: (not t["main"], t["loop"], t["name"]))
    return {"reason": reason, "time": clock, "cwd": os.getcwd(), "threads": threads}


class Location:
    """Where one thread of a capture is, in user terms.

    Attributes:
        thread: the thread's name; ``main`` whether it is the main thread.
        frame: its innermost ``user`` frame (else its innermost frame), as captured.
        inside: the asyncdist function it is in, called from ``frame`` (None: outside any).
        cwd: the rank's working folder, to show ``frame``'s file short.
    """

    __slots__ = ("thread", "main", "frame", "inside", "cwd")

    def __init__(self, thread: str, main: bool, frame: dict[str, Any], inside: str | None, cwd: str | None) -> None:
        self.thread, self.main, self.frame, self.inside, self.cwd = thread, main, frame, inside, cwd

    def as_dict(self) -> dict[str, Any]:
        """For ``--json``: the thread, the frame and the asyncdist call it is in."""
        frame = self.frame
        return {"thread": self.thread, "main": self.main, "file": frame["file"], "line": frame["line"],
                "function": frame["function"], "code": frame.get("code", ""), "inside": self.inside}  # fmt: skip


def _user_frame(frames: list[dict[str, Any]]) -> int:
    """The index of the innermost ``user`` frame (else of the innermost frame)."""
    users = [i for i, f in enumerate(frames) if f.get("origin") == USER]
    return users[-1] if users else len(frames) - 1


def _asyncdist_call(frames: list[dict[str, Any]], at: int) -> str | None:
    """The asyncdist function that frame ``at`` calls into, if any. Frames inward
    of a loop running its callbacks (asyncio's ``Handle._run``) are the loop's
    work, not the user's call: a loop in the user's thread (the await API's
    ``asyncio.run``) is no asyncdist call."""
    for frame in frames[at + 1:]:
        if frame.get("function") == "Handle._run":
            return None
        if frame.get("origin") == ASYNCDIST:
            return str(frame["function"])
    return None


def _frames_of(thread: dict[str, Any]) -> list[dict[str, Any]]:
    """A thread's frames; for the capturing loop thread, only those outward of
    the loop running its callbacks (inward is asyncdist's own work, the capture)."""
    frames: list[dict[str, Any]] = thread.get("frames") or []
    if thread.get("loop"):
        runs = [i for i, f in enumerate(frames) if f.get("function") == "Handle._run"]
        if runs:
            return frames[: runs[0]]
    return frames


def chosen(threads: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The thread to tell of: the main thread, unless it is the capturing loop
    thread with no asyncdist call of the user's running on it (a facade call
    may run the loop in the caller's thread); else the first other thread
    with user code; None if there is none."""
    for thread in threads:
        frames = _frames_of(thread)
        if thread.get("main") and frames:
            if not thread.get("loop") or _asyncdist_call(frames, _user_frame(frames)) is not None:
                return thread
    others = [t for t in threads if not t.get("loop") and t.get("frames")]
    return next((t for t in others if any(f.get("origin") == USER for f in t["frames"])), None)


def user_thread(captured: dict[str, Any], frames: int) -> dict[str, Any] | None:
    """A capture of only its :func:`chosen` thread, and of that thread only its
    innermost user frame and the frames it calls, ``frames`` at most (for a
    hang answer, which must stay small); None if no thread tells.
    :func:`locate` reads it as it reads a whole capture."""
    thread = chosen(captured.get("threads") or [])
    if thread is None:
        return None
    relevant = _frames_of(thread)
    at = _user_frame(relevant)
    return {"cwd": captured.get("cwd"), "threads": [{**thread, "frames": relevant[at : at + frames]}]}


def locate(captured: dict[str, Any]) -> Location | None:
    """Where the capture's user thread (:func:`chosen`) is; None if no thread tells.

    Reads a capture from a dump or a hang answer: it trusts only the keys it
    finds (``threads`` and each frame's ``origin``).
    """
    thread = chosen(captured.get("threads") or [])
    if thread is None:
        return None
    frames = _frames_of(thread)
    at = _user_frame(frames)
    return Location(thread["name"], bool(thread.get("main")), frames[at], _asyncdist_call(frames, at),
                    captured.get("cwd"))  # fmt: skip


def where_text(location: Location) -> str:
    """``main thread is in job.py:7 in main (time.sleep(30)), outside any asyncdist call``."""
    frame = location.frame
    file = frame["file"]
    if location.cwd and file.startswith(location.cwd.rstrip(os.sep) + os.sep):
        file = file[len(location.cwd.rstrip(os.sep)) + 1:]
    who = "main thread" if location.main else f"thread {location.thread!r}"
    code = f" ({frame['code']})" if frame.get("code") else ""
    call = f"inside asyncdist's {location.inside}" if location.inside else "outside any asyncdist call"
    return f"{who} is in {file}:{frame['line']} in {frame['function']}{code}, {call}"

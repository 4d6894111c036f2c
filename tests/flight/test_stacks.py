"""Stack captures: every thread's frames with their origin, where the user's
thread is, and the dumps a peer's question makes (at most one a second)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

import asyncdist
from asyncdist.flight import stacks
from asyncdist.flight.dumps import ASKED_INTERVAL, Dumps, dump_file
from asyncdist.flight.recorder import Recorder

BOUND = 10.0


def _blocked(release: threading.Event, ready: threading.Event) -> None:
    ready.set()
    release.wait()  # the loader blocks here
    ready.clear()


def _line(marker: str) -> int:
    source = Path(__file__).read_text().splitlines()
    return next(n for n, line in enumerate(source, 1) if line.strip().endswith(marker))


def _waits_in_condition(ident: int) -> bool:
    """Whether thread ``ident`` is blocked in threading's Condition.wait (called from _blocked's Event.wait)."""
    innermost = sys._current_frames()[ident]
    return innermost.f_code.co_name == "wait" and innermost.f_code.co_filename == threading.__file__ and \
        innermost.f_back is not None and innermost.f_back.f_back is not None and \
        innermost.f_back.f_back.f_code.co_name == "_blocked"


@pytest.fixture
def loader() -> Iterator[threading.Thread]:
    """A thread named 'loader' blocked in ``Event.wait``, called from ``_blocked`` at its marked line."""
    release, ready = threading.Event(), threading.Event()
    thread = threading.Thread(target=_blocked, args=(release, ready), name="loader", daemon=True)
    thread.start()
    assert ready.wait(BOUND)
    deadline = time.monotonic() + BOUND
    while not _waits_in_condition(thread.ident):  # it is between set() and wait()
        assert time.monotonic() < deadline
        time.sleep(0.001)
    yield thread
    release.set()
    thread.join(BOUND)


def test_a_capture_holds_every_thread_with_its_frames_and_their_origin(loader: threading.Thread) -> None:
    captured = stacks.capture("because", 12.5)
    assert (captured["reason"], captured["time"], captured["cwd"]) == ("because", 12.5, os.getcwd())
    by_name = {thread["name"]: thread for thread in captured["threads"]}
    assert set(by_name) >= {"MainThread", "loader"}
    main, thread = by_name["MainThread"], by_name["loader"]
    assert (main["main"], main["loop"], main["ident"]) == (True, True, threading.main_thread().ident)
    assert (thread["main"], thread["loop"], thread["daemon"], thread["ident"]) == (False, False, True, loader.ident)

    # Outermost first: threading's bootstrap and run(), this file's function, then Event.wait's frames.
    functions = [f["function"] for f in thread["frames"]]
    assert functions[-4:] == ["Thread.run", "_blocked", "Event.wait", "Condition.wait"], functions
    assert thread["frames"][-3] == {"file": __file__, "line": _line("# the loader blocks here"),
                                    "function": "_blocked", "code": "release.wait()", "origin": "user"}  # no comment
    assert [f["origin"] for f in thread["frames"]] == ["library"] * (len(functions) - 3) + ["user"] + ["library"] * 2
    assert thread["frames"][-1]["file"] == threading.__file__
    assert main["frames"][-1]["function"] == "capture" and main["frames"][-1]["origin"] == "asyncdist"


def test_origins() -> None:
    assert stacks.origin(asyncdist.__file__) == "asyncdist"
    assert stacks.origin(threading.__file__) == "library"
    assert stacks.origin(pytest.__file__) == "library"  # site-packages
    assert stacks.origin(__file__) == "user"
    assert stacks.origin("<frozen runpy>") == "library"
    assert stacks.origin("<string>") == "user"


def test_a_deep_stack_keeps_its_innermost_frames() -> None:
    def deep(n: int) -> dict[str, Any]:
        return deep(n - 1) if n else stacks.capture("deep", 0.0)

    main = next(t for t in deep(3 * stacks.MAX_FRAMES)["threads"] if t["main"])
    assert len(main["frames"]) == stacks.MAX_FRAMES
    assert [f["function"] for f in main["frames"][-2:]] == [
        "test_a_deep_stack_keeps_its_innermost_frames.<locals>.deep", "capture"]


def _capture_from_a_loop_callback() -> dict[str, Any]:
    """A capture as the loop thread takes it: in a callback of the loop (asyncio's Handle._run)."""
    loop, captured = asyncio.new_event_loop(), []
    try:
        loop.call_soon(lambda: captured.append(stacks.capture("x", 0.0)))
        loop.call_soon(loop.stop)
        loop.run_forever()
    finally:
        loop.close()
    return captured[0]


def test_the_loop_thread_is_passed_over_for_the_thread_in_user_code(loader: threading.Thread) -> None:
    captured = _capture_from_a_loop_callback()
    assert next(t for t in captured["threads"] if t["main"])["loop"]
    location = stacks.locate(captured)
    assert location is not None
    assert (location.thread, location.main, location.inside) == ("loader", False, None)
    assert stacks.where_text(location) == (
        f"thread 'loader' is in tests/flight/test_stacks.py:{_line('# the loader blocks here')} in _blocked "
        "(release.wait()), outside any asyncdist call")


def _frame(file: str, line: int, function: str, origin: str) -> dict[str, Any]:
    return {"file": file, "line": line, "function": function, "code": f"code of {function}", "origin": origin}


FACADE_CALL = [
    _frame("/job/train.py", 30, "<module>", "user"),
    _frame("/job/train.py", 12, "step", "user"),
    _frame("/site/asyncdist/facade/collectives.py", 80, "all_reduce", "asyncdist"),
    _frame("/site/asyncdist/loop/thread.py", 200, "LoopThread.run", "asyncdist"),
    _frame("/usr/lib/python3.11/threading.py", 320, "Condition.wait", "library"),
]
LOOP_IN_USER_THREAD = [
    _frame("/job/train.py", 40, "<module>", "user"),
    _frame("/usr/lib/python3.11/asyncio/events.py", 80, "Handle._run", "library"),
    _frame("/site/asyncdist/engine/engine.py", 300, "Engine._control_frame", "asyncdist"),
]


# The loop's work, inward of a facade call that runs the loop in the caller's thread.
LOOP_WORK = [
    _frame("/usr/lib/python3.11/asyncio/base_events.py", 1900, "BaseEventLoop._run_once", "library"),
    _frame("/usr/lib/python3.11/asyncio/events.py", 80, "Handle._run", "library"),
    _frame("/site/asyncdist/flight/instruments.py", 60, "Flight.control", "asyncdist"),
    _frame("/site/asyncdist/flight/stacks.py", 90, "capture", "asyncdist"),
]


@pytest.mark.parametrize("loop", [False, True])
def test_a_user_call_into_asyncdist_is_named_also_when_it_runs_the_loop(loop: bool) -> None:
    frames = FACADE_CALL + LOOP_WORK if loop else FACADE_CALL
    captured = {"cwd": "/job", "threads": [{"name": "MainThread", "main": True, "loop": loop, "frames": frames}]}
    location = stacks.locate(captured)
    assert location is not None
    assert stacks.where_text(location) == (
        "main thread is in train.py:12 in step (code of step), inside asyncdist's all_reduce")
    assert location.as_dict() == {"thread": "MainThread", "main": True, "file": "/job/train.py", "line": 12,
                                  "function": "step", "code": "code of step", "inside": "all_reduce"}


def test_a_hang_answer_keeps_the_user_frame_and_the_call_it_makes() -> None:
    other = {"name": "pin", "main": False, "loop": False, "frames": FACADE_CALL[:2]}
    main = {"name": "MainThread", "main": True, "loop": True, "frames": FACADE_CALL + LOOP_WORK}
    captured = {"cwd": "/job", "threads": [main, other]}
    short = stacks.user_thread(captured, 2)
    assert short == {"cwd": "/job", "threads": [{**main, "frames": FACADE_CALL[1:3]}]}
    assert stacks.locate(short).as_dict() == stacks.locate(captured).as_dict()  # type: ignore[union-attr]
    assert stacks.user_thread({"cwd": "/", "threads": []}, 2) is None


def test_a_loop_that_the_user_runs_is_no_asyncdist_call() -> None:
    main = {"name": "MainThread", "main": True, "loop": True, "frames": LOOP_IN_USER_THREAD}
    assert stacks.locate({"cwd": "/", "threads": [main]}) is None  # the loop capturing itself tells nothing
    location = stacks.locate({"cwd": "/", "threads": [{**main, "loop": False}]})
    assert location is not None and (location.frame["line"], location.inside) == (40, None)


def test_a_question_captures_and_dumps_at_most_once_a_second(tmp_path: Path) -> None:
    recorder = Recorder(2, capacity=8)
    now = [100.0]
    recorder.clock = lambda: now[0]
    dumps = Dumps(recorder, world_size=3, job_id="job", directory=str(tmp_path))

    def written() -> dict[str, Any]:
        return json.loads(dump_file(tmp_path, 2).read_text())

    dumps.on_asked("rank 0 asks")
    first = written()
    assert (first["version"], first["reason"]) == (2, "rank 0 asks")
    assert [(c["reason"], c["time"]) for c in first["stacks"]] == [("rank 0 asks", 100.0)]
    assert any(t["main"] and t["frames"] for t in first["stacks"][0]["threads"])

    now[0] += ASKED_INTERVAL / 2
    dumps.on_asked("rank 1 asks")  # too soon: nothing new
    assert written() == first and len(dumps.stacks) == 1

    now[0] += ASKED_INTERVAL
    dumps.on_asked("rank 1 asks again")
    assert [c["reason"] for c in written()["stacks"]] == ["rank 0 asks", "rank 1 asks again"]


def test_a_dump_keeps_the_newest_captures() -> None:
    dumps = Dumps(Recorder(0, capacity=8), world_size=1, job_id="job", directory=None)
    for n in range(7):
        dumps.on_failure(f"failure {n}")
    assert [c["reason"] for c in dumps.snapshot("now")["stacks"]] == [f"failure {n}" for n in range(3, 7)]


def test_nothing_is_captured_with_the_recorder_off(tmp_path: Path) -> None:
    dumps = Dumps(Recorder(0, capacity=0), world_size=1, job_id="job", directory=str(tmp_path))
    dumps.on_asked("rank 1 asks")
    dumps.on_failure("failure")
    assert dumps.stacks == [] and not dump_file(tmp_path, 0).exists()

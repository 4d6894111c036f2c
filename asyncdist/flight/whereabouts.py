"""Live hang diagnosis: a waiting rank asks the ranks it waits on where they are.

When a collective call has waited ``ASYNCDIST_HANG_WARN`` seconds (default
60; 0 turns it off), its channel asks each peer it still waits on, over the
existing connection, a :class:`~asyncdist.wire.control.Where` frame naming
the call's context. The peer's loop answers at once with a
:class:`~asyncdist.wire.control.Here` frame: its latest operation of that
context (or, if it kept none, its latest of any) from its flight recorder,
as JSON. The waiting rank then logs one warning that names them all::

    all_reduce #57 on group world has waited 60 s for rank 3, which is at
    all_reduce #56 on group world (completed 61.2 s ago); its main thread is
    in train.py:40 in load (time.sleep(3600)), outside any asyncdist call

A peer's loop answers even while its user code is busy elsewhere (the
facade runs the loop in its own thread), so a rank that skipped a call is
found where it is: the answer carries its user's thread's innermost
:data:`ANSWER_FRAMES` frames (:mod:`~asyncdist.flight.stacks`), and the
question makes it capture all its stacks and dump
(:meth:`~asyncdist.flight.dumps.Dumps.on_asked`). Nothing runs while
nothing waits: the question rides on the deadline's timer of the waiting
call (:func:`~asyncdist.engine.operation.arm_deadline`).

Loop thread only.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Mapping

from .. import settings
from . import stacks
from .descriptions import Description, short
from .recorder import Recorder
from ..transport.stream import Connection
from ..wire.control import ControlFrame, Here, Where

__all__ = ["Whereabouts", "HANG_WARN_ENV", "hang_warn_from_env"]

log = logging.getLogger("asyncdist.hang")

HANG_WARN_ENV = settings.name_of("hang_warn")
# How long the warning waits for the peers' answers before naming those that did not answer.
_ANSWER_SECONDS = 5.0
#: Frames of the user's thread an answer carries (the innermost): enough to pass a
#: library's frames to the user's, small enough for a control frame (a few KiB).
ANSWER_FRAMES = 16


def hang_warn_from_env(environ: Mapping[str, str] | None = None) -> float:
    """``ASYNCDIST_HANG_WARN`` in seconds (0: off), default 60, as the settings say (or ``environ``).

    Raises:
        ConfigurationError: not a number of seconds >= 0.
    """
    return (settings.current() if environ is None else settings.Settings.from_environ(environ)).hang_warn


def _state(answer: dict[str, Any]) -> str:
    age = answer.get("for", 0)
    if answer.get("state") in ("posted", "started"):
        return f"waiting for {age:g} s"
    return f"{answer.get('state')} {age:g} s ago"


def _peer_clause(rank: int, answer: dict[str, Any] | None, answered: bool) -> str:
    if not answered:
        return f"rank {rank}, which did not answer within {_ANSWER_SECONDS:g} s"
    if answer is None:
        return f"rank {rank}, which has recorded no operation"
    where = short(Description.from_dict(answer["described"], answer["desc"]), answer["seq"], answer["group"])
    clause = f"rank {rank}, which is at {where} ({_state(answer)})"
    location = stacks.locate(answer["stack"]) if isinstance(answer.get("stack"), dict) else None
    return clause if location is None else f"{clause}; its {stacks.where_text(location)}"



class Whereabouts:
    """Questions to peers about where they are, and this rank's answers to theirs.

    Args:
        rank: this rank.
        recorder: where this rank's answers come from.
        connections: the engine's live map of peer rank to connection (read only).
    """

    def __init__(self, rank: int, recorder: Recorder, connections: Mapping[int, Connection]) -> None:
        self._rank = rank
        self._recorder = recorder
        self._connections = connections
        self._next = 0
        self._questions: dict[int, tuple[set[int], dict[int, Any], asyncio.Future]] = {}
        self._reports: set[asyncio.Task] = set()

    def warn(self, ctx: int, seq: int, described: Description, group: str, members: list[int], awaited: list[int],
             since: float) -> None:  # fmt: skip
        """Ask the call's other ``members`` where they are; log one warning once they answered.

        The warning names the members that are not in this call (behind, or in
        another), which is where a hang starts; if every member is in it, the
        peers it ``awaited`` directly (global ranks both).

        Args:
            ctx, seq, described, group: the waiting operation. A message is
                named by its description, and its peers answer with their
                latest operation of any context (the question's ``any_context``).
            since: when it began (loop time).
        """
        waited = self._recorder.clock() - since
        what = short(described, seq, group)
        report = self._report(ctx, seq, what, members, awaited, waited, described.is_message)
        task = asyncio.ensure_future(report)
        self._reports.add(task)
        task.add_done_callback(self._reports.discard)

    async def _report(self, ctx: int, seq: int, what: str, members: list[int], awaited: list[int],
                      waited: float, any_context: bool) -> None:  # fmt: skip
        qid = self._next = self._next + 1
        future = asyncio.get_running_loop().create_future()
        answers: dict[int, Any] = {}
        question = Where(self._rank, ctx, qid, any_context)
        waiting = {peer for peer in members if self._send(peer, question)}
        self._questions[qid] = (waiting, answers, future)
        try:
            if waiting:
                await asyncio.wait((future,), timeout=_ANSWER_SECONDS)
        finally:
            self._questions.pop(qid, None)

        def elsewhere(rank: int) -> bool:
            answer = answers.get(rank)
            return rank not in answers or answer is None or (answer.get("ctx"), answer.get("seq")) != (ctx, seq)

        named = [rank for rank in members if elsewhere(rank)] or awaited
        clauses = " and ".join(_peer_clause(p, answers.get(p), p in answers) for p in named)
        log.warning("rank %d: %s has waited %.3g s for %s", self._rank, what, waited, clauses)

    def question(self, rank: int, frame: Where, captured: dict[str, Any] | None = None) -> None:
        """A peer asks where this rank is in context ``frame.ctx``: answer it,
        with where the user's thread is in ``captured`` (a capture of
        :func:`~asyncdist.flight.stacks.capture`; None: no stack)."""
        where = self._recorder.where(None if frame.any_context else frame.ctx)
        if where is not None and captured is not None and (stack := stacks.user_thread(captured, ANSWER_FRAMES)):
            where["stack"] = stack
        self._send(rank, Here(self._rank, frame.ctx, frame.question, json.dumps(where)))

    def answer(self, rank: int, frame: Here) -> None:
        """A peer answered question ``frame.question``."""
        question = self._questions.get(frame.question)
        if question is None:
            return  # too late: the warning has been logged
        waiting, answers, future = question
        try:
            answers[rank] = answer = json.loads(frame.answer)
        except ValueError:
            answers[rank] = answer = None
        if isinstance(answer, dict):  # kept for the dump: the analyzer's word on a rank that leaves none
            self._recorder.heard[rank] = {**answer, "asked": self._recorder.clock()}
        waiting.discard(rank)
        if not waiting and not future.done():
            future.set_result(None)

    def _send(self, rank: int, frame: ControlFrame) -> bool:
        """Send a control frame to ``rank``; False if it cannot go."""
        connection = self._connections.get(rank)
        return connection is not None and connection.send_control(frame)

    async def close(self) -> None:
        """Log the warnings still waiting for answers with what came, and end them."""
        for _, _, future in list(self._questions.values()):
            if not future.done():
                future.set_result(None)
        if self._reports:
            await asyncio.gather(*self._reports, return_exceptions=True)

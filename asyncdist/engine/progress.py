"""What an operation in flight is still waiting for, and how its timeout is worded.

An operation that times out should say where it is stuck: which call of
which group, and which peers have not yet delivered (or taken) their data.
Two clocks ask that question. The group's deadline asks it inside the
operation, on the loop thread; ``Work.wait(timeout)`` asks it from a user
thread while the operation runs on. Both get their answer here, from the
same objects, worded by the same function:

* a *step* (the :class:`Step` protocol) is one part of an operation that
  waits on peers, and reports which peers it awaits *now*: an
  :class:`~asyncdist.engine.operation.Operation`, a collective call (its
  :class:`~asyncdist.engine.channel.Channel`) or one point-to-point message;
* a :class:`Progress` is what a :class:`~asyncdist.group.work.Work` holds: the
  steps its operation has opened so far. A coroutine started as a Work
  (:meth:`~asyncdist.group.work.Work.start`) runs in a context whose
  :data:`CURRENT` is its Progress, so every collective call it makes,
  itself or in tasks it starts, registers there (:func:`register`) without
  any signature changing, the way a tracing span is found (this is why
  :data:`CURRENT` stays a context variable). Code that runs
  outside a Work (a plain ``await``, the facade without ``async_op``)
  registers nothing and pays one context-variable lookup per call;
* :func:`timeout_message` is the one wording of every operation timeout.

It must not know sockets, matching or groups: steps report group ranks and
the global rank of each, and this module only words them.

Threads: steps are created and updated on the loop thread; ``Work.wait``
reads them from another thread. Readers take snapshots (``list(d.items())``
of a dict whose keys hash by identity runs in C without releasing the GIL)
and check futures' ``done()``, so a report may be a moment stale, never torn.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import Protocol, Sequence

from ..errors import OperationTimeoutError

__all__ = ["Awaited", "Step", "Progress", "register", "context_for", "timeout_message", "WAIT_TIMEOUT"]

#: What a ``Work.wait(timeout)`` expiry adds after "Timed out after T s".
WAIT_TIMEOUT = " (Work.wait timeout)"


@dataclass(frozen=True, slots=True)
class Awaited:
    """The peers a step waits on at one moment, as group ranks (sorted, distinct).

    Attributes:
        receiving: peers whose data has not arrived yet.
        sending: peers that have not yet taken what this rank sends them
            (a send whose last byte is not in the kernel yet).
        members: the global rank of each group rank, so that a message can
            name both where they differ (a subgroup); empty: not known.
    """

    receiving: tuple[int, ...] = ()
    sending: tuple[int, ...] = ()
    members: tuple[int, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.receiving or self.sending)

    def merged(self, other: Awaited) -> Awaited:
        """Both steps' peers together (steps of one operation share a group)."""
        return Awaited(
            tuple(sorted(set(self.receiving) | set(other.receiving))),
            tuple(sorted(set(self.sending) | set(other.sending))),
            self.members or other.members,
        )

    def describe(self) -> str:
        """'still waiting for ranks [2, 3]', 'still sending to rank 1', both joined by '; ', or ''."""
        parts = []
        if self.receiving:
            parts.append(f"still waiting for {self._name(self.receiving)}")
        if self.sending:
            parts.append(f"still sending to {self._name(self.sending)}")
        return "; ".join(parts)

    def _name(self, group_ranks: tuple[int, ...]) -> str:
        """'rank 2' / 'ranks [2, 3]', then '(global ...)' where those differ."""
        words = f"rank {group_ranks[0]}" if len(group_ranks) == 1 else f"ranks {list(group_ranks)}"
        if self.members:
            global_ranks = [self.members[r] for r in group_ranks]
            if global_ranks != list(group_ranks):
                words += f" (global {global_ranks[0] if len(global_ranks) == 1 else global_ranks})"
        return words


def timeout_message(rank: int, where: str, seconds: float, awaited: Awaited, *, why: str = "") -> str:
    """The text of every operation's OperationTimeoutError (any thread).

    Args:
        rank: this process's global rank.
        where: the operation, as its step names it: "all_reduce(sum,
            float64[4]) (call #7 in group 'world')", "recv from rank 0 (tag 3,
            group 'world')".
        seconds: the timeout that expired.
        awaited: the peers it was still waiting on when it expired.
        why: which timeout, when not the group's (:data:`WAIT_TIMEOUT`).

    Example::

        rank 0: all_reduce(sum, float64[4]) (call #7 in group 'world') Timed out
        after 0.5 s (Work.wait timeout); still waiting for ranks [2, 3]

    "Timed out" is gloo's word ("Timed out waiting 1800000ms for recv
    operation to complete"), on which code written for torch matches.
    """
    message = f"rank {rank}: {where} Timed out after {seconds:g} s{why}"
    detail = awaited.describe()
    return f"{message}; {detail}" if detail else message


class Step(Protocol):
    """One part of an operation that waits on peers (a collective call, a message)."""

    @property
    def where(self) -> str:
        """The step as timeout messages name it, call number or tag and group included."""
        ...

    def is_open(self) -> bool:
        """False once the step has finished, however it ended."""
        ...

    def awaited(self) -> Awaited:
        """The peers it waits on now (any thread: a snapshot)."""
        ...


class Progress:
    """The steps one Work's operation has opened, to say where it is stuck.

    Args:
        rank: this process's global rank.
        what: the operation as the Work names it ("all_reduce on group
            'world'"), for when no step is open.
        steps: steps known at once (a point-to-point message).

    Created on the loop thread; :meth:`timeout_error` may run on any thread.
    """

    __slots__ = ("rank", "what", "_steps")

    def __init__(self, rank: int, what: str, steps: Sequence[Step] = ()) -> None:
        self.rank = rank
        self.what = what
        self._steps: list[Step] = list(steps)

    def add(self, step: Step) -> None:
        """Record a step the operation opened (loop thread)."""
        self._steps.append(step)

    def waiting(self) -> tuple[str, Awaited]:
        """Where the operation is and the peers it awaits now (any thread).

        Where: the open steps that wait on peers (an operation of several
        calls, such as ``all_reduce_coalesced``, has opened them all, but
        only the running one waits), or every open step if none waits yet,
        or the operation itself if it has opened none.
        """
        open_steps = [step for step in list(self._steps) if step.is_open()]
        reports = [(step, step.awaited()) for step in open_steps]
        waiting = [(step, awaited) for step, awaited in reports if awaited] or reports
        where = " and ".join(step.where for step, _ in waiting) or self.what
        awaited = Awaited()
        for _, part in waiting:
            awaited = awaited.merged(part)
        return where, awaited

    def timeout_error(self, seconds: float) -> OperationTimeoutError:
        """The error of a ``Work.wait`` that gave up after ``seconds`` (any thread),
        naming where the operation is and whom it awaits (:meth:`waiting`)."""
        where, awaited = self.waiting()
        return OperationTimeoutError(timeout_message(self.rank, where, seconds, awaited, why=WAIT_TIMEOUT))


#: The Progress of the Work this code runs for, if any (a step made on the hot
#: path reads it inline, :meth:`~asyncdist.engine.channel.Channel.__init__`).
CURRENT: contextvars.ContextVar[Progress | None] = contextvars.ContextVar("asyncdist_progress", default=None)


def register(step: Step) -> None:
    """Add ``step`` to the Progress of the Work this code runs for, if any (loop thread)."""
    progress = CURRENT.get()
    if progress is not None:
        progress.add(step)


def context_for(progress: Progress) -> contextvars.Context:
    """A copy of the current context in which :func:`register` reports to ``progress``."""
    context = contextvars.copy_context()
    context.run(CURRENT.set, progress)
    return context

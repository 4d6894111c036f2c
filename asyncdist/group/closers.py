"""What a group releases when it closes: its closers, run newest first.

A group owns what was opened for it (the world group: the engine and the
store; a group given NCCL: its communicator). When a group is shrunk or
grown, its successor takes these over (:meth:`Closers.hand_to`), so that
closing the successor releases them and closing the old group does not.
Loop thread only.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

__all__ = ["Closers"]


class Closers:
    """A group's closers (functions or coroutine functions)."""

    __slots__ = ("_closers",)

    def __init__(self) -> None:
        self._closers: list[Callable[[], Any]] = []

    def add(self, closer: Callable[[], Any]) -> None:
        """Run ``closer`` when the group closes."""
        self._closers.append(closer)

    def hand_to(self, successor: Closers) -> None:
        """Give ``successor`` every closer: it releases them now, not this group."""
        successor._closers.extend(self._closers)
        self._closers = []

    async def run(self) -> None:
        """Run every closer, newest first, even when one fails; raise the first
        failure after the last closer."""
        closers, self._closers = self._closers, []
        failure: BaseException | None = None
        for closer in reversed(closers):
            try:
                result = closer()
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:
                failure = failure or exc
        if failure is not None:
            raise failure

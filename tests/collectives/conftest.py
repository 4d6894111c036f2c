"""Worlds of every size, kept for the whole session on one background loop.

Property-based tests run hundreds of examples; starting 8 ranks for each
would dominate. The worlds live on a LoopThread, and a test submits one
coroutine per example that drives every rank with ``asyncio.gather``.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Callable, Coroutine

import pytest

from asyncdist.group.process_group import ProcessGroup
from asyncdist.loop.thread import LoopThread
from asyncdist.testing import local_world


class Worlds:
    """Lazily started local worlds, by size, on one loop thread."""

    def __init__(self) -> None:
        self.portal = LoopThread("test-worlds")
        self._stack = contextlib.AsyncExitStack()
        self._worlds: dict[int, list[ProcessGroup]] = {}

    def get(self, n: int) -> list[ProcessGroup]:
        if n not in self._worlds:
            self._worlds[n] = self.portal.run(self._stack.enter_async_context(local_world(n, timeout=60)))
        return self._worlds[n]

    def run(self, n: int, per_rank: Callable[[ProcessGroup], Coroutine[Any, Any, Any]]) -> list[Any]:
        """Run ``per_rank(group)`` on every rank of the size-n world at once; results by rank."""
        ranks = self.get(n)

        async def all_ranks() -> list[Any]:
            return await asyncio.gather(*(per_rank(group) for group in ranks))

        return self.portal.run(all_ranks())

    def close(self) -> None:
        self.portal.run(self._stack.aclose())
        self.portal.stop()


@pytest.fixture(scope="session")
def worlds() -> Worlds:
    w = Worlds()
    yield w
    w.close()

"""Waiting for the mesh to form, with the rendezvous's wait reports.

The engine dials its lower peers and waits for the higher ones to dial in;
:class:`Arrivals` is woken as each connection is attached or a peer is lost.
At init (:func:`wait_for_peers`) the wait is a deadline that names the ranks
still missing, and logs them whenever a report is due
(``ASYNCDIST_INIT_REPORT_EVERY``); a grow's wait (:meth:`Arrivals.settle`)
stops at nothing but the deadline, and says who is not connected then.
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, Container, Coroutine, Mapping

from ..errors import RendezvousError
from ..rendezvous.waiting import WaitReports

__all__ = ["Arrivals", "wait_for_peers"]


class Arrivals:
    """What a rank waiting for its peers' connections waits on (loop thread).

    Args:
        connections: the engine's live map of peer rank to connection.
        lost: the peers lost so far (a grow's wait stops waiting for them).
    """

    def __init__(self, connections: Mapping[int, object], lost: Container[int]) -> None:
        self._connections = connections
        self._lost = lost
        self._changed: asyncio.Future | None = None

    def changed(self) -> None:
        """A connection was attached, or a peer lost: wake the wait."""
        if self._changed is not None and not self._changed.done():
            self._changed.set_result(None)

    def close(self) -> None:
        """Stop a wait still going on (the engine closes)."""
        if self._changed is not None and not self._changed.done():
            self._changed.cancel()

    async def all_of(self, wanted: set[int]) -> None:
        """Return once every rank of ``wanted`` is connected."""
        while not wanted <= self._connections.keys():
            self._changed = asyncio.get_running_loop().create_future()
            await self._changed

    async def settle(self, wanted: list[int], dials: list[Coroutine[object, object, None]], timeout: float) -> list[int]:
        """Run ``dials`` and wait until each rank of ``wanted`` is connected or lost,
        or ``timeout`` seconds of the loop's clock pass; the ranks not connected then."""
        loop = asyncio.get_running_loop()
        tasks = [asyncio.ensure_future(dial) for dial in dials]
        deadline = loop.time() + timeout
        try:
            while True:
                self._changed = loop.create_future()
                if all(p in self._connections or p in self._lost for p in wanted) or loop.time() >= deadline:
                    return [p for p in wanted if p not in self._connections]
                await asyncio.wait([self._changed], timeout=deadline - loop.time())
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def wait_for_peers(
    rank: int,
    joined: Awaitable[object],
    timeout: float,
    unconnected: Callable[[], list[int]],
    reports: WaitReports | None = None,
) -> None:
    """Await ``joined`` (the dials and the arrivals) for at most ``timeout`` seconds.

    Raises:
        RendezvousError: naming ``unconnected()`` when the time is up.
        PeerLostError, HandshakeError: as ``joined`` raises them.
    """
    task = asyncio.ensure_future(joined)
    deadline = time.monotonic() + timeout
    try:
        while not task.done():
            now = time.monotonic()
            if now >= deadline:
                raise RendezvousError(f"rank {rank}: ranks {unconnected()} did not connect within {timeout:g} s")
            if reports is not None and reports.due(now):
                reports.report(now, unconnected(), "connect")
            wake = min(deadline, reports.next_at) if reports is not None else deadline
            await asyncio.wait([task], timeout=max(wake - now, 0.001))
        task.result()
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

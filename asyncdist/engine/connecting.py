"""Waiting for the mesh to form, with the rendezvous's wait reports.

The engine dials its lower peers and waits for the higher ones to dial in;
this module turns that wait into a deadline that names the ranks still
missing, and logs them whenever a report is due (``ASYNCDIST_INIT_REPORT_EVERY``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable

from ..errors import RendezvousError
from ..rendezvous.waiting import WaitReports


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

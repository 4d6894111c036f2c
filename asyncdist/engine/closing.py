"""How a rank leaves its peers: a goodbye to each, flushed, then a bounded
wait until each has read it.

A socket closed with data unread is reset, and a reset destroys what the
peer had not read yet: this rank's last messages, its goodbye among them (a
broadcast's root that leaves first). So a leaving rank queues its BYE on
every connection and waits until the kernel has it, and until every payload
sent by memory has been read (:func:`flush_goodbye`); then it stops writing
and waits until each peer has closed its end, which a peer does once it has
read the BYE (:func:`linger`). What peers send meanwhile (an announcement of
a call this rank has finished) is read and dropped. Both waits are bounded:
a live peer's loop reads within milliseconds, and a stopped one is not
waited for longer.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Iterable

from ..errors import PeerLostError
from ..transport.stream import Connection

__all__ = ["flush_goodbye", "linger", "DRAIN_SECONDS", "LINGER_SECONDS"]

log = logging.getLogger("asyncdist.engine.engine")  # the engine's: a leaving rank's lines stay under one name

#: How long :func:`flush_goodbye` waits for the queued frames to reach the kernel.
DRAIN_SECONDS = 10.0
#: How long :func:`linger` waits for every peer to have read the goodbye.
LINGER_SECONDS = 5.0


async def flush_goodbye(rank: int, connections: Iterable[Connection], bye: bytes) -> None:
    """Queue ``bye`` on every connection and wait, at most :data:`DRAIN_SECONDS`,
    until each has handed its frames to the kernel (:meth:`Connection.drain`).
    A connection whose write fails loses its peer and is skipped."""
    drains = []
    for connection in list(connections):  # a failed write loses its peer, which leaves the engine's dict
        try:
            connection.send_frame(bye, None)
        except PeerLostError:
            continue
        drains.append(connection.drain())
    if drains:
        drained = asyncio.gather(*drains, return_exceptions=True)
        if not (await asyncio.wait((drained,), timeout=DRAIN_SECONDS))[0]:
            drained.cancel()
            log.warning("rank %d: peers did not take the last frames within %g s", rank, DRAIN_SECONDS)


async def linger(connections: Iterable[Connection], peers_gone: asyncio.Future) -> None:
    """Stop writing to every connection (a FIN after the goodbye) and wait, at
    most :data:`LINGER_SECONDS`, for ``peers_gone``: the engine resolves it
    once the last peer has closed its end. Those left are closed after it."""
    for connection in connections:
        connection.shutdown_write()
    await asyncio.wait((peers_gone,), timeout=LINGER_SECONDS)

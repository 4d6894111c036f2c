"""The streams between the ranks of a job: listening, accepting, dialing.

A :class:`Mesh` owns one rank's listening socket and its accept loop, and
dials the lower ranks: the higher rank of each pair dials the lower one, so
each pair has exactly one stream. Every socket that passes the handshake
(:mod:`.connect`) is handed to the ``attach`` callback, which wraps it in a
:class:`~asyncdist.transport.stream.Connection`; a stranger, or a rank that
fails authentication, is refused in the handshake and never reaches it. So is
a second connection from a rank (``wanted`` says which ranks may still dial in).

It must not know frames, matching or what happens to a lost peer.
Loop thread only.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Callable

from ..wire.handshake import Identity, PeerAccess
from .connect import accept_handshake, dial, open_listener

__all__ = ["Mesh"]

log = logging.getLogger("asyncdist.engine.engine")


class Mesh:
    """Listens for, accepts and dials one rank's peers.

    Args:
        me: this rank's identity (job id, rank, world size, secret).
        handshake_timeout: seconds an incoming connection may take to
            authenticate before it is dropped.
        attach: called with ``(peer, socket, access)`` for each authenticated
            stream (``access``: whether the two may read each other's memory).
        wanted: whether ``peer`` (a higher rank) may still dial in.
    """

    def __init__(
        self,
        me: Identity,
        *,
        handshake_timeout: float,
        attach: Callable[[int, socket.socket, PeerAccess], None],
        wanted: Callable[[int], bool],
    ) -> None:
        self.me = me
        self.handshake_timeout = handshake_timeout
        self._attach = attach
        self._wanted = wanted
        self._listener: socket.socket | None = None
        self._tasks: set[asyncio.Task] = set()
        self._closing = False

    async def listen(self, host: str) -> tuple[str, int]:
        """Listen on an ephemeral port of ``host``; return (host, port) to publish.

        Raises:
            OSError: the address cannot be bound.
        """
        self._listener = open_listener(host)
        self._spawn(self._accept_loop())
        return host, self._listener.getsockname()[1]

    async def dial(self, peer: int, host: str, port: int) -> None:
        """Connect to ``peer`` at host:port, authenticate, and attach the stream.

        Raises:
            PeerLostError: the peer cannot be reached.
            HandshakeError: the peer is not a rank of this job, or refused us.
        """
        self._attach(peer, *await dial(asyncio.get_running_loop(), host, port, self.me, peer))

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._listener is not None
        while True:
            try:
                sock, _ = await loop.sock_accept(self._listener)
            except OSError as exc:
                if self._closing:
                    return
                log.warning("rank %d: accept failed: %s", self.me.rank, exc)
                continue
            self._spawn(self._admit(sock))

    async def _admit(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        rank = self.me.rank
        try:
            admitted = await asyncio.wait_for(accept_handshake(loop, sock, self.me), self.handshake_timeout)
        except asyncio.TimeoutError:
            log.warning("rank %d: dropped a connection that did not finish the handshake in time", rank)
            sock.close()
            return
        except asyncio.CancelledError:  # closing
            sock.close()
            raise
        if admitted is None:
            return
        peer, access = admitted
        if peer < rank or self._closing or not self._wanted(peer):
            log.warning("rank %d: refused an unexpected second connection from rank %d", rank, peer)
            sock.close()
            return
        self._attach(peer, sock, access)

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Stop accepting, drop handshakes in progress, close the listener."""
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._listener is not None:
            self._listener.close()

"""Large payloads between processes of one host, by address instead of through the stream.

A peer that can read this process's memory (:mod:`.cma`) is sent a large
payload's address in a ``Kind.REMOTE`` header: it copies the payload out of
this process and answers with a DONE frame, which completes the send. DONEs
come back in the order the payloads were sent, so a queue pairs them with
their sends, and keeps each payload alive until its DONE. The other way
round, a REMOTE header from the peer is read here (:meth:`ByMemory.take`,
or :meth:`ByMemory.fold` for a receive that combines rather than copies) and
answered with a DONE.

One :class:`ByMemory` per :class:`~asyncdist.transport.stream.Connection`,
which hands it the frames to send; loop thread only.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Callable

from ..errors import PeerLostError, ProtocolError
from ..wire.frames import Header, Kind, encode_header
from ..wire.handshake import PeerMemoryReader
from . import cma

__all__ = ["ByMemory", "Fold"]

#: ``fold(piece, offset)``: combine ``piece`` (uint8) into a receive's buffer at
#: byte ``offset``. The reduction comes from above (:func:`asyncdist.reduce.kernels.folder`);
#: the transport only hands it the bytes as they are read.
Fold = Callable[[Any, int], None]


class ByMemory:
    """One connection's payloads by address, both ways.

    Args:
        peer: the peer's rank (for error messages).
        peer_memory: how to read the peer's memory, None if this process cannot.
        send_frame: the connection's ``send_frame(header, payload)``.
        done_frame: the encoded DONE frame this process answers with.

    Attributes:
        awaiting_done: ``(future, payload)`` of each payload sent by address,
            oldest first, until the peer's DONE for it.
    """

    __slots__ = ("peer", "peer_memory", "awaiting_done", "_send_frame", "_done_frame")

    def __init__(
        self,
        peer: int,
        peer_memory: PeerMemoryReader | None,
        send_frame: Callable[[bytes, memoryview | None], asyncio.Future | None],
        done_frame: bytes,
    ) -> None:
        self.peer = peer
        self.peer_memory = peer_memory
        self.awaiting_done: deque[tuple[asyncio.Future, memoryview]] = deque()
        self._send_frame = send_frame
        self._done_frame = done_frame

    def send(self, loop: asyncio.AbstractEventLoop, header: Header, payload: memoryview) -> asyncio.Future:
        """Send ``header`` as REMOTE with ``payload``'s address; the future resolves
        when the peer has read the payload (its DONE). Raises PeerLostError if the
        connection is closed."""
        remote = header._replace(kind=Kind.REMOTE, addr=cma.address_of(payload))
        self._send_frame(encode_header(remote), None)  # its write completing means nothing yet
        future = loop.create_future()
        self.awaiting_done.append((future, payload))  # keeps the payload alive
        return future

    def done(self) -> None:
        """The peer read the oldest payload sent by address.

        Raises:
            ProtocolError: no payload was waiting for it.
        """
        if not self.awaiting_done:
            raise ProtocolError(f"rank {self.peer} acknowledged a payload that was never sent by memory")
        future, _ = self.awaiting_done.popleft()
        if not future.done():
            future.set_result(None)

    def take(self, dest: memoryview, addr: int) -> None:
        """Copy a REMOTE payload from the peer's memory at ``addr`` into ``dest``,
        and tell the peer with a DONE frame that it may reuse it. Raises
        ProtocolError if the peer's memory cannot be read (the connection is dropped)."""
        cma.read_payload(self.peer_memory, self.peer, dest, addr)
        self._send_frame(self._done_frame, None)

    def fold(self, fold: Fold, nbytes: int, addr: int) -> None:
        """Like :meth:`take`, for a receive that folds its message in piece by
        piece (:func:`~asyncdist.transport.cma.fold_payload`).

        Raises:
            ProtocolError: as for :meth:`take`.
        """
        cma.fold_payload(self.peer_memory, self.peer, fold, nbytes, addr)
        self._send_frame(self._done_frame, None)

    def fail(self, error: PeerLostError) -> None:
        """The connection ended: every send still waiting for its DONE fails with ``error``."""
        for future, _ in self.awaiting_done:
            if not future.done():
                future.set_exception(error)
        self.awaiting_done.clear()

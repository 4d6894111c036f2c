"""Who the TCP store's server serves, and how much it holds for them.

:class:`Gate` is one connection's authentication (sans-I/O: requests in,
replies out); :class:`PartialFrames` is the budget of bytes that incomplete
frames may hold across connections, and who reads on. The limits are named
constants with their reason. :mod:`.tcp_server` owns the connections and
applies both; this module touches no socket and no loop.

Incomplete frames are not allocated at their announced size: a connection
holds what has arrived. The one that began its frame first always reads
on, so a frame of :data:`~.tcp_protocol.MAX_FRAME_BYTES` always gets
through; the others together may hold :data:`MAX_PARTIAL_BYTES`, past which
the one that read last stops being read (the kernel's buffers, then its
client, wait) until the total falls. A request that arrives whole is never
held back. Measured: 8 connections that
each send 59 MiB of a 60 MiB frame and stop grew the server's RSS by
473 MiB before this bound, and by about 70 MiB after.
"""

from __future__ import annotations

import collections
import hmac
import os
from typing import Protocol

from .tcp_protocol import NONCE_BYTES, OP_AUTH, OP_CHALLENGE, OP_NAMES, STATUS_DENIED, STATUS_INVALID, STATUS_OK, auth_proof

__all__ = ["Gate", "PartialFrames", "Reader", "MAX_UNAUTHENTICATED", "MAX_PARTIAL_BYTES"]

#: Connections that may wait to authenticate at once; the next closes the
#: oldest. A job's ranks authenticate in a round trip, so 64 is room for a
#: world of hundreds connecting at once and bounds what strangers hold.
MAX_UNAUTHENTICATED = 64
#: Bytes that incomplete frames may hold, all connections together but the
#: one that began its frame first, before the server stops reading them. The
#: first may always grow to MAX_FRAME_BYTES, so the total stays under
#: MAX_FRAME_BYTES + MAX_PARTIAL_BYTES (+ one read, 256 KiB, per connection).
#: Rendezvous frames are a few hundred bytes, so only a large set waits.
MAX_PARTIAL_BYTES = 16 * 1024 * 1024



class Reader(Protocol):
    """A connection whose reading :class:`PartialFrames` stops and restarts."""

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class Gate:
    """One connection's authentication, server side (open at once without a secret)."""

    __slots__ = ("_secret", "_nonce", "open")

    def __init__(self, secret: bytes | None) -> None:
        self._secret = secret
        self._nonce: bytes | None = None
        self.open = secret is None

    def answer(self, op: int, args: list) -> list:
        """The reply to a challenge, an authentication, or a request before either."""
        secret = self._secret
        if op == OP_CHALLENGE:
            self._nonce = None if secret is None else os.urandom(NONCE_BYTES)
            return [STATUS_OK, self._nonce]
        if op == OP_AUTH:
            if secret is None:
                return [STATUS_INVALID, "this store has no secret: there is nothing to authenticate"]
            nonce, self._nonce = self._nonce, None
            if nonce is None:
                return [STATUS_DENIED, "authentication without a challenge"]
            client_nonce, proof = args
            if not hmac.compare_digest(proof, auth_proof(secret, "client", nonce, client_nonce)):
                return [STATUS_DENIED, "wrong secret"]
            self.open = True
            return [STATUS_OK, auth_proof(secret, "server", nonce, client_nonce)]
        return [STATUS_DENIED, f"{OP_NAMES[op]} before authenticating: this store has a secret; give the "
                               "client the job's secret (ASYNCDIST_SECRET, or TCPStore(secret=...))"]


class PartialFrames:
    """The bytes that incomplete frames hold, by connection, and who may read on.

    Connections are kept in the order in which they began their incomplete
    frame. The first always reads on. When the others together hold more
    than :data:`MAX_PARTIAL_BYTES`, the one that just read stops reading; the
    stopped ones read again when the others' total is back under the limit. Server loop only.
    """

    def __init__(self) -> None:
        self.held: collections.OrderedDict[Reader, int] = collections.OrderedDict()
        self.total = 0
        self.paused: collections.OrderedDict[Reader, None] = collections.OrderedDict()

    def _others(self) -> int:
        """Bytes held by all but the oldest incomplete frame."""
        return self.total - next(iter(self.held.values()), 0)

    def update(self, conn: Reader, nbytes: int) -> None:
        """``conn`` now holds ``nbytes`` of an incomplete frame (0: none)."""
        before = self.held.pop(conn, 0) if nbytes == 0 else self.held.get(conn, 0)
        if nbytes:
            self.held[conn] = nbytes  # keeps its place if it held bytes already
        else:
            self.paused.pop(conn, None)
        self.total += nbytes - before
        oldest = next(iter(self.held), None)
        if oldest is not None and oldest in self.paused:  # the oldest always reads on
            del self.paused[oldest]
            oldest.resume_reading()
        if self._others() > MAX_PARTIAL_BYTES:
            if nbytes and conn is not oldest and conn not in self.paused:
                self.paused[conn] = None
                conn.pause_reading()
        else:  # each reads at most once more before it is stopped again
            while self.paused:
                waiting, _ = self.paused.popitem(last=False)
                waiting.resume_reading()

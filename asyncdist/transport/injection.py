"""Where a test's fault plan reaches the transport: the one hook, None unless a plan sets it.

A fault plan (:mod:`asyncdist.testing.faults`) delays, slows and cuts links
and refuses connections. It reaches the transport through :data:`INJECTOR`,
which is None in every process that runs no plan. The transport consults it
once per connection (when the connection is made, or dialed), never per
message: a connection of a link no plan touches has no gate, and its send
path tests one attribute.

* :meth:`Injector.gate` gives the new connection from ``me`` to ``peer`` a
  :class:`Gate` (or None). Every frame the connection sends passes the gate
  first, which may hold it (a delay, a slow link, a cut): frames leave in
  the order they were sent, later. Closing the socket passes the gate too:
  the peer of a cut link does not see the end of the stream before the link
  heals, as it would not see a FIN that the network dropped.
* :meth:`Injector.refused` says whether ``me`` may not connect to ``peer``
  at init (the dial fails as if the peer refused it).

This module knows connections' sends and closes as thunks; not plans, ranks'
operations or the engine. Loop thread only.
"""

from __future__ import annotations

import asyncio
from typing import Callable, Protocol

from ..wire.frames import Header, encode_header

__all__ = ["Gate", "Gated", "Injector", "INJECTOR", "pass_through"]


class Gate(Protocol):
    """What one direction of a link does to the frames that cross it (see the module doc)."""

    def send(self, write: Callable[[], asyncio.Future | None], nbytes: int) -> asyncio.Future | None:
        """Run ``write`` (which sends one frame of ``nbytes`` bytes) now or later, in order;
        its result, or a future that resolves as that of the later ``write`` does."""

    def close(self, close: Callable[[], None]) -> None:
        """Run ``close`` (which closes the socket) now, or once the link passes bytes again."""

    def fail(self, error: BaseException) -> None:
        """The connection ended: fail the frames still held with ``error``, drop them."""


class Injector(Protocol):
    """A fault plan as the transport sees it (:mod:`asyncdist.testing.injector`)."""

    def gate(self, me: int, peer: int) -> Gate | None:
        """The gate of the new connection from rank ``me`` to rank ``peer``, or None."""

    def refused(self, me: int, peer: int) -> bool:
        """Whether rank ``me``'s connection with rank ``peer`` fails at init."""


#: The fault plan of this process, or None (the only state of this module).
INJECTOR: Injector | None = None


class Gated(Protocol):
    """A connection, as its gate wraps it (:class:`~asyncdist.transport.stream.Connection`)."""

    closed: bool

    def send_frame(self, header: bytes, payload: memoryview | None) -> asyncio.Future | None: ...

    def send_message(self, header: Header, payload: memoryview | None) -> asyncio.Future | None: ...

    def write_late(self, header: bytes, payload: memoryview | None) -> None:
        """Write a frame the gate released after the connection closed (best effort)."""


def pass_through(connection: Gated, gate: Gate) -> None:
    """Send every frame of ``connection`` through ``gate``: instance attributes shadow
    its two send methods, so a connection without a gate pays nothing. A frame the
    gate releases after the connection closed is written late, before the socket's
    held-back close, as the kernel would have sent it before the FIN."""
    send_frame, send_message = connection.send_frame, connection.send_message

    def gated_frame(header: bytes, payload: memoryview | None) -> asyncio.Future | None:
        return gate.send(lambda: connection.write_late(header, payload) if connection.closed
                         else send_frame(header, payload), len(header) + (payload.nbytes if payload else 0))

    def gated_message(header: Header, payload: memoryview | None) -> asyncio.Future | None:
        return gate.send(lambda: connection.write_late(encode_header(header), payload) if connection.closed
                         else send_message(header, payload), 64 + (payload.nbytes if payload else 0))

    # The gate wraps this connection's own sends, on the instance: a test seam, not a subclass.
    setattr(connection, "send_frame", gated_frame)
    setattr(connection, "send_message", gated_message)

"""``Channel``: what a collective algorithm needs of the ranks it runs on.

An algorithm in this package is a coroutine over one *call*: it sees its
own group rank and the group size, and sends and receives host buffers by
group rank. This module says exactly that, as a :class:`typing.Protocol`,
and nothing more. It knows no engine, transport, frame or context number:
the engine's channel (:class:`asyncdist.engine.channel.Channel`) satisfies
the Protocol structurally, and so does the in-memory one the property tests
use (:mod:`asyncdist.collectives.in_memory`), without either inheriting
from it.

What an algorithm may rely on, whichever channel it runs over:

* **Matching.** Every message of a call goes to one posted receive; between
  one sender and one receiver, messages arrive in the order they were
  started (MPI's non-overtaking rule), so an algorithm that posts its
  receives in the order its peer starts the sends gets them in order.
* **Fit.** A message lands only in a buffer of the same dtype and number of
  elements; otherwise the receive fails with
  :class:`~asyncdist.errors.BufferMismatchError`.
* **Ownership.** A buffer being sent must not change until its send is
  waited for; a buffer being received into must not be read until its
  receive is waited for (or written at all, while a fold is pending).
* **Units.** Peers are group ranks, ``0 <= peer < size``; buffers are
  :class:`~asyncdist.buffers.host.HostBuffer` s; sizes are elements or bytes
  as each name says. There are no timeouts here: a channel enforces the
  call's deadline in its waits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Awaitable, Protocol, TypeVar

import numpy as np

from ..buffers.host import HostBuffer

__all__ = ["Channel", "Fold", "Recv", "sendrecv"]

#: ``fold(piece, offset)``: combine ``piece`` (a uint8 array of whole
#: elements) into a receive buffer at byte ``offset`` instead of the bytes
#: overwriting it. A channel may call it once with the whole message or
#: several times with consecutive pieces; each piece is read once, so a
#: reduction needs no receive buffer of its own. Made by
#: :func:`asyncdist.reduce.kernels.folder`.
Fold = Callable[[np.ndarray, int], None]

#: The handle of a posted receive (:meth:`Channel.start_recv`): opaque to the
#: algorithm, which only hands it back to :meth:`Channel.wait_recv` or
#: :meth:`Channel.withdraw` of the channel that made it.
Recv = TypeVar("Recv")


class Channel(Protocol[Recv]):
    """Send and receive by group rank within one collective call.

    Generic in the type of its receive handles, which only the channel
    reads: an algorithm written over ``Channel[Recv]`` works with any.
    """

    @property
    def rank(self) -> int:
        """This rank's place in the group, ``0 <= rank < size``."""
        ...

    @property
    def size(self) -> int:
        """The number of ranks in the group (>= 1)."""
        ...

    def by_memory(self, peer: int, *, sending: bool) -> bool:
        """Whether the link to (``sending``) or from group rank ``peer``
        carries large payloads by memory: the receiver copies them straight
        out of the sender's buffer, so a message costs only its overhead and
        there is no transfer to overlap with work.

        A capability of the link, not an instruction: both ends of a link get
        the same answer, so an algorithm may pick its message sizes by it
        (the ring sends larger chunks over such links) and the two ends
        still agree on how the data is cut.
        """
        ...

    def start_send(self, buf: HostBuffer, peer: int) -> asyncio.Future[None] | None:
        """Start sending ``buf`` to group rank ``peer``; never waits.

        Returns:
            A future to pass to :meth:`wait_send`, or None if the send is
            complete already. ``buf`` must not change until then.
        """
        ...

    def wait_send(self, future: asyncio.Future[None] | None, peer: int) -> Awaitable[None]:
        """Await what this returns to wait until a send from :meth:`start_send` to
        ``peer`` no longer needs its buffer."""
        ...

    def start_recv(self, buf: HostBuffer, peer: int, fold: Fold | None = None) -> Recv:
        """Post a receive into ``buf`` from group rank ``peer``; never waits.

        Args:
            buf: writable; the message's dtype and element count must match.
            peer: the sender.
            fold: combine the message into ``buf`` (see :data:`Fold`) instead
                of overwriting it.

        Returns:
            A handle for :meth:`wait_recv` (or :meth:`withdraw`).
        """
        ...

    def wait_recv(self, recv: Recv, peer: int) -> Awaitable[object]:
        """Await what this returns to wait for a receive posted with :meth:`start_recv` from ``peer``.

        Returns:
            A description of the message, which algorithms do not need.

        Raises:
            BufferMismatchError: the message does not fit the buffer.
        """
        ...

    def withdraw(self, recv: Recv) -> None:
        """Take back a posted receive that will not be waited for (the call failed)."""
        ...

    def send(self, buf: HostBuffer, peer: int) -> Awaitable[None]:
        """Send ``buf`` to group rank ``peer``: await what this returns."""
        ...

    def recv(self, buf: HostBuffer, peer: int) -> Awaitable[object]:
        """Receive into ``buf`` from group rank ``peer``: await what this returns."""
        ...


def sendrecv(
    channel: Channel[Recv], send_buf: HostBuffer, dst: int, recv_buf: HostBuffer, src: int, fold: Fold | None = None
) -> Awaitable[object]:
    """Send ``send_buf`` to ``dst`` and receive into ``recv_buf`` (folding it in,
    if ``fold`` is given) from ``src`` at once, over any Channel (no extra
    tasks); await what this returns. The receive is withdrawn if the send fails.

    A send that is complete already (a small message) leaves only the
    receive to wait for, which is then awaited without a coroutine of its own.
    """
    sending = channel.start_send(send_buf, dst)
    receiving = channel.start_recv(recv_buf, src, fold)
    if sending is None:
        return channel.wait_recv(receiving, src)
    return _send_then_receive(channel, sending, dst, receiving, src)


async def _send_then_receive(
    channel: Channel[Recv], sending: asyncio.Future[None], dst: int, receiving: Recv, src: int
) -> object:
    try:
        await channel.wait_send(sending, dst)
    except BaseException:
        channel.withdraw(receiving)
        raise
    return await channel.wait_recv(receiving, src)

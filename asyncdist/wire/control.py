"""Control frames as typed values, and their headers (sans-I/O, as h11's events).

A control frame is a header without a payload that tells the peer something
about the connection or a group, not a message for the matching engine: a
goodbye, a heartbeat, an abort, a revoke, a step of an agreement, a question
about where a rank is, a step of the shared-memory ring agreement. Each is
one frozen dataclass here, with named fields; :func:`encode_control` turns
one into the bytes of a frame and :func:`decode_control` turns a decoded
:class:`~asyncdist.wire.frames.Header` of a control kind back into one. Only
this module knows which header field carries which value, so no other layer
builds or reads a positional header for a control frame.

The bytes are the :class:`~asyncdist.wire.frames.Header` encoding of
protocol version 4: a control frame's unused fields are ``"uint8"``, ``()``
and 0, and its payload length is always 0.

Invariants:

* ``decode_control(decode_header(body))`` of ``encode_control(frame)`` is
  ``frame`` for every frame whose reason fits :data:`MAX_REASON_CHARS`.
* A control header that names an unknown step, carries a payload or has a
  field out of range raises :class:`~asyncdist.errors.ProtocolError` (the
  caller drops the connection, as for any malformed header).
* No ``await``, no socket, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Union

from ..errors import ProtocolError
from .frames import Header, Kind, encode_header

__all__ = [
    "Bye",
    "Ping",
    "Done",
    "Wake",
    "Abort",
    "Revoke",
    "Agree",
    "Expel",
    "Where",
    "Here",
    "RingOffer",
    "RingAccepted",
    "RingRefused",
    "RingBack",
    "RingFrame",
    "ControlFrame",
    "encode_control",
    "decode_control",
    "MAX_REASON_CHARS",
]

#: Reasons (an abort's error message, an expulsion's why) are cut to this many
#: characters: enough for any error asyncdist writes, and a bound on a header
#: that must fit :data:`~asyncdist.wire.frames.MAX_HEADER_BYTES`.
MAX_REASON_CHARS = 2000

# The tag of an AGREE frame that is an expulsion notice (agreement instances are >= 0).
_EXPEL_TAG = -1
# The steps of the ring agreement (the ``seq`` of a RING frame).
_OFFER, _ACCEPTED, _REFUSED, _BACK = 0, 1, 2, 3


def _plain(kind: Kind, src: int, *, ctx: int = 0, tag: int = 0, seq: int = 0, op: str = "", shape: tuple[int, ...] = ()) -> Header:
    return Header(kind, ctx, src, tag, seq, "uint8", shape, 0, op)


@dataclass(frozen=True, slots=True)
class Bye:
    """Orderly close: ``src`` will send nothing more.

    Attributes:
        src: the sender's global rank.
        signal: the number of the signal that ends the sender, 0 for a plain close.
    """

    src: int
    signal: int = 0

    def header(self) -> Header:
        """This frame's header."""
        return _plain(Kind.BYE, self.src, tag=self.signal)


@dataclass(frozen=True, slots=True)
class Ping:
    """A heartbeat on an idle stream: nothing to deliver, proves ``src`` is alive."""

    src: int

    def header(self) -> Header:
        """This frame's header."""
        return _plain(Kind.PING, self.src)


@dataclass(frozen=True, slots=True)
class Done:
    """``src`` has read the oldest payload it read from the receiver's memory
    (``Kind.REMOTE``) on this stream: the receiver may reuse it."""

    src: int

    def header(self) -> Header:
        """This frame's header."""
        return _plain(Kind.DONE, self.src)


@dataclass(frozen=True, slots=True)
class Wake:
    """Look at the shared-memory rings with ``src``: data to read, or room to write."""

    src: int

    def header(self) -> Header:
        """This frame's header."""
        return _plain(Kind.WAKE, self.src)


@dataclass(frozen=True, slots=True)
class Abort:
    """The sender's part of collective call (``ctx``, ``tag``) failed.

    Attributes:
        src: the sender's global rank.
        ctx, tag: the call.
        error: the name of the error's class (the engine maps it back to a class).
        reason: the error's message (cut to :data:`MAX_REASON_CHARS`).
        lost: for a lost peer, the global rank lost; else None.
    """

    src: int
    ctx: int
    tag: int
    error: str
    reason: str
    lost: int | None = None

    def header(self) -> Header:
        """This frame's header."""
        shape = () if self.lost is None else (self.lost,)
        return Header(Kind.ABORT, self.ctx, self.src, self.tag, max(self.tag, 0), self.error, shape, 0,
                      self.reason[:MAX_REASON_CHARS])  # fmt: skip


@dataclass(frozen=True, slots=True)
class Revoke:
    """The group of context ``ctx`` is revoked (flooded: each rank forwards it once).

    Attributes:
        src: the sender's global rank.
        ctx: the group's collective context.
        by: the global rank that began the revoke.
    """

    src: int
    ctx: int
    by: int

    def header(self) -> Header:
        """This frame's header."""
        return _plain(Kind.REVOKE, self.src, ctx=self.ctx, tag=self.by)


@dataclass(frozen=True, slots=True)
class Agree:
    """One step of a fault-tolerant agreement of the group of ``ctx``.

    Attributes:
        src: the sender's global rank.
        ctx: the group's collective context.
        instance: the agreement's number in the group (>= 0).
        step: what the frame is in the protocol (the group layer names the steps).
        body: the step's content, as the group layer writes it (JSON).
    """

    src: int
    ctx: int
    instance: int
    step: int
    body: str

    def header(self) -> Header:
        """This frame's header."""
        if self.instance < 0:
            raise ValueError(f"agreement instance {self.instance} is negative")
        return _plain(Kind.AGREE, self.src, ctx=self.ctx, tag=self.instance, seq=self.step, op=self.body)


@dataclass(frozen=True, slots=True)
class Expel:
    """``src`` drops the receiver, counting it as failed: the receiver is out of the job.

    Attributes:
        src: the sender's global rank.
        reason: why (cut to :data:`MAX_REASON_CHARS`).
    """

    src: int
    reason: str

    def header(self) -> Header:
        """This frame's header."""
        return _plain(Kind.AGREE, self.src, tag=_EXPEL_TAG, op=self.reason[:MAX_REASON_CHARS])


@dataclass(frozen=True, slots=True)
class Where:
    """A waiting rank asks where the receiver is in context ``ctx``.

    Attributes:
        src: the sender's global rank.
        ctx: the context the sender waits in.
        question: the sender's number for the question (the answer repeats it).
        any_context: answer with the latest operation of any context, not only ``ctx``.
    """

    src: int
    ctx: int
    question: int
    any_context: bool = False

    def header(self) -> Header:
        """This frame's header."""
        return _plain(Kind.WHERE, self.src, ctx=self.ctx, tag=self.question, seq=int(self.any_context))


@dataclass(frozen=True, slots=True)
class Here:
    """The answer to :class:`Where` ``question``: the latest recorded operation, as JSON.

    Attributes:
        src: the sender's global rank.
        ctx: the question's context.
        question: the question's number.
        answer: the recorder's answer, JSON.
    """

    src: int
    ctx: int
    question: int
    answer: str

    def header(self) -> Header:
        """This frame's header."""
        return _plain(Kind.HERE, self.src, ctx=self.ctx, tag=self.question, op=self.answer)


@dataclass(frozen=True, slots=True)
class RingOffer:
    """``src`` made a shared-memory ring for the receiver to write, and offers it.

    Attributes:
        src: the sender's global rank.
        pid: the sender's process id (the ring's memory is opened through it).
        fd: the ring memory's file descriptor in the sender's process.
        nonce: the bytes the ring starts with, so that the receiver knows it opened the right one.
        capacity: the ring's size in bytes.
    """

    src: int
    pid: int
    fd: int
    nonce: bytes
    capacity: int

    def header(self) -> Header:
        """This frame's header."""
        return _plain(Kind.RING, self.src, ctx=self.pid, tag=self.fd, seq=_OFFER, op=self.nonce.hex(), shape=(self.capacity,))


@dataclass(frozen=True, slots=True)
class RingAccepted:
    """``src`` opened the receiver's ring: the last frame it writes to the socket before the ring."""

    src: int

    def header(self) -> Header:
        """This frame's header."""
        return _plain(Kind.RING, self.src, seq=_ACCEPTED)


@dataclass(frozen=True, slots=True)
class RingRefused:
    """``src`` cannot write the receiver's ring (another host, rings off there, no ``/proc``)."""

    src: int

    def header(self) -> Header:
        """This frame's header."""
        return _plain(Kind.RING, self.src, seq=_REFUSED)


@dataclass(frozen=True, slots=True)
class RingBack:
    """``src`` writes to the ring again after switch number ``switch`` to the socket."""

    src: int
    switch: int

    def header(self) -> Header:
        """This frame's header."""
        return _plain(Kind.RING, self.src, tag=self.switch, seq=_BACK)


RingFrame = Union[RingOffer, RingAccepted, RingRefused, RingBack]
ControlFrame = Union[Bye, Ping, Done, Wake, Abort, Revoke, Agree, Expel, Where, Here, RingFrame]


def encode_control(frame: ControlFrame) -> bytes:
    """The whole frame that carries ``frame``: length prefix and header (no payload follows).

    Raises:
        ValueError: a field is out of range (an agreement instance below 0).
    """
    return encode_header(frame.header())


def _malformed(header: Header, why: str) -> ProtocolError:
    return ProtocolError(f"rank {header.src} sent a malformed {Kind(header.kind).name} frame: {why}")


def _abort(h: Header) -> Abort:
    if len(h.shape) > 1:
        raise _malformed(h, f"shape {h.shape}")
    return Abort(h.src, h.ctx, h.tag, h.dtype, h.op, h.shape[0] if h.shape else None)


def _agree(h: Header) -> Agree | Expel:
    if h.tag == _EXPEL_TAG:
        return Expel(h.src, h.op)
    if h.tag < 0:
        raise _malformed(h, f"agreement instance {h.tag}")
    return Agree(h.src, h.ctx, h.tag, h.seq, h.op)


def _ring(h: Header) -> RingFrame:
    if h.seq == _OFFER:
        try:
            nonce = bytes.fromhex(h.op)
        except ValueError:
            raise _malformed(h, f"nonce {h.op!r:.80}") from None
        if len(h.shape) != 1:
            raise _malformed(h, f"capacity {h.shape}")
        return RingOffer(h.src, h.ctx, h.tag, nonce, h.shape[0])
    if h.seq == _ACCEPTED:
        return RingAccepted(h.src)
    if h.seq == _REFUSED:
        return RingRefused(h.src)
    if h.seq == _BACK:
        return RingBack(h.src, h.tag)
    raise _malformed(h, f"unknown step {h.seq}")


_DECODERS: dict[int, Callable[[Header], ControlFrame]] = {
    Kind.BYE: lambda h: Bye(h.src, h.tag),
    Kind.PING: lambda h: Ping(h.src),
    Kind.DONE: lambda h: Done(h.src),
    Kind.WAKE: lambda h: Wake(h.src),
    Kind.ABORT: _abort,
    Kind.REVOKE: lambda h: Revoke(h.src, h.ctx, h.tag),
    Kind.AGREE: _agree,
    Kind.WHERE: lambda h: Where(h.src, h.ctx, h.tag, bool(h.seq)),
    Kind.HERE: lambda h: Here(h.src, h.ctx, h.tag, h.op),
    Kind.RING: _ring,
}


def decode_control(header: Header) -> ControlFrame:
    """The control frame that ``header`` (from :func:`~asyncdist.wire.frames.decode_header`) carries.

    Raises:
        ProtocolError: ``header`` is a message (``Kind.DATA``, ``Kind.REMOTE``),
            announces a payload, or is not a well-formed frame of its kind.
    """
    decode = _DECODERS.get(header.kind)
    if decode is None:
        raise ProtocolError(f"rank {header.src} sent a frame of kind {header.kind} where a control frame was expected")
    if header.nbytes:
        raise _malformed(header, f"a payload of {header.nbytes} bytes")
    return decode(header)

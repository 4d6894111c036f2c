"""The wire format: frames and their decoder, with no sockets and no clock.

A frame is::

    +-----------------+---------------------------+---------------------+
    | header length   | header: msgpack array     | payload: raw bytes  |
    | 4 bytes, big-e. | (see ``Header``)          | ``header.nbytes``   |
    +-----------------+---------------------------+---------------------+

The header is small and parsed; the payload is never parsed, pickled or
msgpacked: it is the raw memory of an array and goes straight into the
destination buffer that the receiver names for it. The decoder therefore
never accumulates a large payload itself: when a header is complete it asks
its :class:`FrameSink` where the payload goes, and from then on hands out
views of that destination to read into (zero copy for large payloads).

Invariants:

* Lengths are checked against limits *before* anything is allocated; a bad
  length or a malformed header raises :class:`ProtocolError` and the
  connection is dropped by the caller (the decoder is then unusable).
* Frames from one stream are delivered in order, each exactly once.
* No ``await``, no socket, no clock: tests feed bytes in any split.

The connection handshake lives in :mod:`asyncdist.wire.handshake`.
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import NamedTuple, Protocol

import msgpack

from ..errors import FrameTooLargeError, ProtocolError

__all__ = [
    "Kind",
    "Header",
    "new_header",
    "FrameSink",
    "FrameDecoder",
    "encode_header",
    "decode_header",
    "PREFIX",
    "MAX_HEADER_BYTES",
    "DEFAULT_MAX_PAYLOAD_BYTES",
]

PREFIX = struct.Struct("!I")

# A data header is ~40 bytes; 64 KiB leaves room for long op descriptions and
# high-dimensional shapes while refusing garbage lengths at once.
MAX_HEADER_BYTES = 64 * 1024
# The largest single message accepted unless the engine is told otherwise.
DEFAULT_MAX_PAYLOAD_BYTES = 1 << 40
# Shapes deeper than this are refused (torch itself caps tensors at 64 dims).
MAX_NDIM = 64
# Below this many outstanding payload bytes the decoder reads into its own
# buffer, so that one recv() can carry the rest of a small payload and the
# next headers; above it, it reads straight into the destination.
DIRECT_READ_MIN_BYTES = 32 * 1024
_READ_BUFFER_BYTES = 256 * 1024

_HEADER_FIELDS = 10


class Kind(IntEnum):
    """What a frame is for."""

    DATA = 1  # a message for the matching engine
    BYE = 2  # orderly close: the sender will send nothing more
    ABORT = 3  # the sender's collective call (ctx, tag) failed; op holds why
    PING = 4  # heartbeat on an idle stream: nothing to deliver, proves the peer is alive
    REMOTE = 5  # a DATA message whose payload the receiver reads from the sender's memory at ``addr``
    DONE = 6  # the receiver has read the oldest REMOTE payload of this stream; the sender may reuse it
    REVOKE = 7  # the group of context ``ctx`` is revoked (flooded: each rank forwards it once); tag: who began it
    AGREE = 8  # fault-tolerant agreement of the group of ``ctx`` (tag: instance, seq: step), or an expulsion notice
    WHERE = 9  # a waiting rank asks where the receiver is in context ``ctx`` (question id in ``tag``; seq 1: any context)
    HERE = 10  # the answer to WHERE ``tag``: the latest recorded operation, as JSON in ``op``
    RING = 11  # a shared-memory ring for the receiver to write (seq 0), or the answer (1 accepted, 2 refused)
    WAKE = 12  # look at the shared-memory rings with the sender: data to read, or room to write


class Header(NamedTuple):
    """Everything the receiver needs to match and check a message.

    A named tuple, in the order of the fields on the wire: it is packed as it
    is, and the hot paths make one with ``new_header(Header, fields)``, a C
    call (a class's own ``__init__`` or ``__new__`` is a Python call each).

    Attributes:
        kind: a :class:`Kind`.
        ctx: the communication context (one per group and purpose), so that
            messages of different groups never match each other.
        src: the sender's global rank.
        tag: the user's or the collective's tag.
        seq: the sender's sequence number of the operation (collectives), for
            mismatch checks and error messages; 0 for point-to-point.
        dtype: canonical dtype name of the payload ("float32", "bfloat16", …).
        shape: the payload's shape as sent.
        nbytes: payload length in bytes.
        op: a short description of the operation the sender is in, compared
            by the receiver to detect ranks that disagree ("" for p2p).
        addr: for ``Kind.REMOTE``, where the payload lies in the sender's
            memory (:mod:`asyncdist.transport.cma`); 0 otherwise. A REMOTE
            frame carries no payload bytes on the stream.
    """

    kind: int
    ctx: int
    src: int
    tag: int
    seq: int
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    op: str = ""
    addr: int = 0


#: ``new_header(Header, (kind, ctx, src, tag, seq, dtype, shape, nbytes, op, addr))``:
#: a :class:`Header` of all ten fields, made without a Python call.
new_header = tuple.__new__

_packer = msgpack.Packer(use_bin_type=True)


def encode_header(header: Header) -> bytes:
    """Return the length prefix and header of a frame (the payload follows)."""
    body = _packer.pack(header)  # a tuple: a msgpack array of the fields in order
    return PREFIX.pack(len(body)) + body


def decode_header(body: bytes | memoryview, max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES) -> Header:
    """Parse and validate a header body (without its length prefix).

    Raises:
        ProtocolError: the bytes are not a well-formed header.
        FrameTooLargeError: the announced payload exceeds ``max_payload``.
    """
    try:
        fields = msgpack.unpackb(
            body,
            use_list=True,
            raw=False,
            strict_map_key=True,
            max_str_len=MAX_HEADER_BYTES,
            max_bin_len=0,
            max_array_len=MAX_NDIM,
            max_map_len=0,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(f"malformed frame header: {exc!r}") from exc
    if not isinstance(fields, list) or len(fields) != _HEADER_FIELDS:
        raise ProtocolError(f"malformed frame header: expected {_HEADER_FIELDS} fields, got {fields!r:.200}")
    kind, ctx, src, tag, seq, dtype, shape, nbytes, op, addr = fields
    # Chained comparisons, not all(...) over a generator: every frame is parsed here.
    if not type(kind) is type(ctx) is type(src) is type(tag) is type(seq) is type(nbytes) is type(addr) is int:
        raise ProtocolError(f"malformed frame header: non-integer field in {fields!r:.200}")
    if not isinstance(dtype, str) or not isinstance(op, str) or not isinstance(shape, list):
        raise ProtocolError(f"malformed frame header: wrong field types in {fields!r:.200}")
    for d in shape:
        if type(d) is not int or d < 0:
            raise ProtocolError(f"malformed frame header: bad shape {shape!r:.200}")
    if src < 0 or ctx < 0 or nbytes < 0 or seq < 0 or addr < 0:
        raise ProtocolError(f"malformed frame header: negative field in {fields!r:.200}")
    if kind not in _KINDS:
        raise ProtocolError(f"malformed frame header: unknown frame kind {kind}")
    if nbytes > max_payload:
        raise FrameTooLargeError(f"frame payload of {nbytes} bytes exceeds the limit of {max_payload} bytes")
    if (kind == Kind.REMOTE) != (addr > 0):
        raise ProtocolError(f"malformed frame header: memory address {addr} on a frame of kind {kind}")
    return new_header(Header, (kind, ctx, src, tag, seq, dtype, tuple(shape), nbytes, op, addr))


_KINDS = frozenset(int(k) for k in Kind)


class FrameSink(Protocol):
    """Where a :class:`FrameDecoder` delivers frames (implemented by the engine)."""

    def payload_buffer(self, header: Header) -> memoryview:
        """Return a writable byte view of exactly ``header.nbytes`` for the payload."""

    def frame_received(self, header: Header, payload: memoryview) -> None:
        """The frame is complete: ``payload`` is the view returned above (empty
        when no payload bytes followed on the stream: none, or ``Kind.REMOTE``)."""


_EMPTY = memoryview(b"")


class FrameDecoder:
    """Incremental frame decoder for one byte stream (sans-I/O).

    Use it like an ``asyncio.BufferedProtocol``: read into ``get_buffer()``,
    then report the count with ``buffer_updated(n)``. Frames are delivered
    to the sink synchronously from ``buffer_updated``.
    """

    __slots__ = (
        "_sink",
        "_max_header",
        "_max_payload",
        "_buf",
        "_view",
        "_start",
        "_end",
        "_header",
        "_dest",
        "_filled",
        "_direct",
    )

    def __init__(
        self,
        sink: FrameSink,
        *,
        max_header: int = MAX_HEADER_BYTES,
        max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        if max_header + PREFIX.size > _READ_BUFFER_BYTES:
            raise ValueError("max_header does not fit the read buffer")
        self._sink = sink
        self._max_header = max_header
        self._max_payload = max_payload
        self._buf = bytearray(_READ_BUFFER_BYTES)
        self._view = memoryview(self._buf)
        self._start = 0  # first unparsed byte in _buf
        self._end = 0  # one past the last received byte in _buf
        self._header: Header | None = None  # set while a payload is being read
        self._dest = _EMPTY
        self._filled = 0
        self._direct = False  # the last get_buffer() returned the destination

    @property
    def max_payload(self) -> int:
        """The largest payload this decoder accepts, in bytes."""
        return self._max_payload

    def get_buffer(self) -> memoryview:
        """Return the writable view the next received bytes must go into."""
        header = self._header
        if header is not None and self._start == self._end:
            remaining = header.nbytes - self._filled
            if remaining >= DIRECT_READ_MIN_BYTES:
                self._direct = True
                return self._dest[self._filled :]
        self._direct = False
        if self._start == self._end:
            self._start = self._end = 0
        elif len(self._buf) - self._end < self._max_header + PREFIX.size:
            # Not enough room for a whole header after the data: move the
            # unparsed bytes to the front (at most one header's worth).
            pending = self._end - self._start
            self._view[:pending] = self._view[self._start : self._end]
            self._start, self._end = 0, pending
        return self._view[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        """Consume ``nbytes`` just written into the last ``get_buffer()`` view.

        Raises:
            ProtocolError: the stream is malformed (the decoder is then dead).
        """
        if self._direct:
            self._direct = False
            self._filled += nbytes
            if self._filled == self._dest.nbytes:
                self._finish_payload()
            return
        self._end += nbytes
        # Then parse what has arrived (inline: every read passes here).
        view = self._view
        while self._start < self._end:
            if self._header is not None:
                take = min(self._end - self._start, self._dest.nbytes - self._filled)
                self._dest[self._filled : self._filled + take] = view[self._start : self._start + take]
                self._start += take
                self._filled += take
                if self._filled == self._dest.nbytes:
                    self._finish_payload()
                continue
            available = self._end - self._start
            if available < PREFIX.size:
                return
            (length,) = PREFIX.unpack_from(view, self._start)
            if length > self._max_header:
                raise FrameTooLargeError(
                    f"frame header of {length} bytes exceeds the limit of {self._max_header} bytes"
                )
            if available < PREFIX.size + length:
                return
            body_start = self._start + PREFIX.size
            header = decode_header(view[body_start : body_start + length], self._max_payload)
            self._start = body_start + length
            if header.nbytes == 0 or header.kind == Kind.REMOTE:  # nothing follows on the stream
                self._sink.frame_received(header, _EMPTY)
                continue
            dest = self._sink.payload_buffer(header)
            if dest.nbytes != header.nbytes:
                raise ProtocolError(f"sink returned {dest.nbytes} bytes for a {header.nbytes}-byte payload")
            self._header, self._dest, self._filled = header, dest, 0

    def _finish_payload(self) -> None:
        header, dest = self._header, self._dest
        self._header, self._dest, self._filled = None, _EMPTY, 0
        assert header is not None
        self._sink.frame_received(header, dest)

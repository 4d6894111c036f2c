"""The TCP store's wire protocol, sans-I/O: frames, requests and replies.

A frame is a 4-byte big-endian length and that many bytes of msgpack. A request
is ``[op, *args]`` with an ``OP_*`` code; a reply is ``[status, value]`` with a
``STATUS_*`` code. This module owns those codes, the frame limit, the encoders,
the stream :class:`FrameDecoder` and the decoders that check a message's shape.

It must not know sockets, event loops, clocks or the store's data: bytes go in,
messages come out, and the server (:mod:`.tcp_server`) and the client
(:mod:`.tcp_store`) do the I/O.

Authentication, when the server has a secret: before anything else, the client
asks for a challenge and proves that it knows the secret, and the server proves
it back, so that neither side trusts a stranger::

    client                                    server
      [OP_CHALLENGE]                      ->
                                          <-  [STATUS_OK, server_nonce]
      [OP_AUTH, client_nonce, proof_c]    ->
                                          <-  [STATUS_OK, proof_s] | [STATUS_DENIED, why]

``proof_c = HMAC-SHA256(secret, "store-client|" server_nonce "|" client_nonce)``
and ``proof_s`` the same with ``"store-server"``: fresh nonces on both sides
make a recorded exchange useless, and the secret never crosses the wire. A
server without a secret answers the challenge with ``None``. Any other request
on a connection that has not authenticated is answered ``STATUS_DENIED`` and
the connection closed; until then frames are limited to
:data:`MAX_AUTH_FRAME_BYTES`.

Invariants: a length over :data:`MAX_FRAME_BYTES` is refused from the header
alone, before anything is allocated for the body; :func:`decode_request` checks
every argument's type, so the server's handlers see only well-formed calls;
every malformed input raises :class:`~asyncdist.errors.ProtocolError` (a
:class:`~asyncdist.errors.FrameTooLargeError` for a length), never another error.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import struct
from collections.abc import Callable
from typing import Any

import msgpack

from ..errors import FrameTooLargeError, ProtocolError
from .store_rules import is_int

__all__ = [
    "HEADER_BYTES", "MAX_FRAME_BYTES", "OP_NAMES",
    "OP_SET", "OP_GET", "OP_ADD", "OP_COMPARE_SET", "OP_WAIT",
    "OP_CHECK", "OP_DELETE", "OP_NUM_KEYS", "OP_JOIN", "OP_WAIT_WORKERS",
    "OP_CHALLENGE", "OP_AUTH", "MAX_AUTH_FRAME_BYTES", "NONCE_BYTES", "AUTH_SECONDS", "auth_proof",
    "STATUS_OK", "STATUS_TIMEOUT", "STATUS_INVALID", "STATUS_DENIED",
    "FrameDecoder", "decode_request", "decode_response", "encode_frame", "frame_length",
]

#: Largest frame either side accepts: a rendezvous value (addresses, an NCCL id,
#: a pickled object list) is far smaller; the bound stops a bad length prefix
#: from making the server allocate gigabytes.
MAX_FRAME_BYTES = 64 * 1024 * 1024
_HEADER = struct.Struct(">I")
#: Bytes of a frame's length header.
HEADER_BYTES = _HEADER.size

OP_SET, OP_GET, OP_ADD, OP_COMPARE_SET, OP_WAIT = 1, 2, 3, 4, 5
OP_CHECK, OP_DELETE, OP_NUM_KEYS, OP_JOIN, OP_WAIT_WORKERS = 6, 7, 8, 9, 10
OP_CHALLENGE, OP_AUTH = 11, 12
STATUS_OK, STATUS_TIMEOUT, STATUS_INVALID, STATUS_DENIED = 0, 1, 2, 3

#: Largest frame accepted on a connection that has not authenticated: the
#: authentication requests are under 100 bytes, and a stranger must not make
#: the server buffer megabytes.
MAX_AUTH_FRAME_BYTES = 1024
#: Bytes of each side's nonce.
NONCE_BYTES = 16
#: Seconds a connection may take to authenticate. A client does it right after
#: connecting, in one round trip, so the server drops a connection that has not
#: by then (a stranger holds a socket no longer), and a client whose challenge
#: is not answered by then gives that server up as lost (a stopping one).
AUTH_SECONDS = 5.0

#: The Store method each op serves, for error messages.
OP_NAMES = {OP_SET: "set", OP_GET: "get", OP_ADD: "add", OP_COMPARE_SET: "compare_set",
            OP_WAIT: "wait", OP_CHECK: "check", OP_DELETE: "delete_key",
            OP_NUM_KEYS: "num_keys", OP_JOIN: "join", OP_WAIT_WORKERS: "wait_for_workers",
            OP_CHALLENGE: "challenge", OP_AUTH: "authenticate"}


def _is_seconds(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < math.inf


def _is_keys(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(k, str) for k in x)


def _is_str(x: Any) -> bool:
    return isinstance(x, str)


def _is_bytes(x: Any) -> bool:
    return isinstance(x, bytes)


def _is_nonce(x: Any) -> bool:
    return isinstance(x, bytes) and len(x) == NONCE_BYTES


_SIGNATURES: dict[int, tuple[Callable[[Any], bool], ...]] = {
    OP_SET: (_is_str, _is_bytes), OP_GET: (_is_str, _is_seconds), OP_ADD: (_is_str, is_int),
    OP_COMPARE_SET: (_is_str, _is_bytes, _is_bytes), OP_WAIT: (_is_keys, _is_seconds),
    OP_CHECK: (_is_keys,), OP_DELETE: (_is_str,), OP_NUM_KEYS: (), OP_JOIN: (),
    OP_WAIT_WORKERS: (is_int, _is_seconds), OP_CHALLENGE: (), OP_AUTH: (_is_nonce, _is_bytes),
}


def auth_proof(secret: bytes, role: str, server_nonce: bytes, client_nonce: bytes) -> bytes:
    """The HMAC-SHA256 with which ``role`` ("client" or "server") proves it knows ``secret``."""
    message = b"store-" + role.encode() + b"|" + server_nonce + b"|" + client_nonce
    return hmac.new(secret, message, hashlib.sha256).digest()


# -- frames -----------------------------------------------------------------


def encode_frame(message: list) -> bytes:
    """Return the frame of ``message`` (a request or a reply): length + msgpack.

    Raises:
        FrameTooLargeError: the body exceeds :data:`MAX_FRAME_BYTES`.
    """
    body = msgpack.packb(message, use_bin_type=True)
    if len(body) > MAX_FRAME_BYTES:
        raise FrameTooLargeError(f"store frame of {len(body)} bytes exceeds {MAX_FRAME_BYTES}")
    return _HEADER.pack(len(body)) + body


def frame_length(header: bytes) -> int:
    """Return the body length announced by a :data:`HEADER_BYTES`-byte frame header.

    Raises:
        FrameTooLargeError: the length exceeds :data:`MAX_FRAME_BYTES`.
    """
    (length,) = _HEADER.unpack(header)
    if length > MAX_FRAME_BYTES:
        raise FrameTooLargeError(f"store frame announces {length} bytes, limit {MAX_FRAME_BYTES}")
    return length


class FrameDecoder:
    """Split a byte stream into frame bodies (sans-I/O). ``feed`` returns whole bodies.

    Attributes:
        max_frame: the largest body accepted (at most :data:`MAX_FRAME_BYTES`);
            the server lowers it until a connection has authenticated.
    """

    def __init__(self, max_frame: int = MAX_FRAME_BYTES) -> None:
        self._buf = bytearray()
        self.max_frame = max_frame

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a whole frame (0 between frames)."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[bytes]:
        """Add received bytes; return the complete frame bodies, oldest first.

        Raises:
            FrameTooLargeError: a header announces more than :data:`MAX_FRAME_BYTES`.
        """
        self._buf += data
        bodies = []
        while len(self._buf) >= HEADER_BYTES:
            length = frame_length(bytes(self._buf[:HEADER_BYTES]))
            if length > self.max_frame:
                raise FrameTooLargeError(f"store frame announces {length} bytes, limit {self.max_frame} here")
            end = HEADER_BYTES + length
            if len(self._buf) < end:
                break
            bodies.append(bytes(self._buf[HEADER_BYTES:end]))
            del self._buf[:end]
        return bodies


# -- messages ---------------------------------------------------------------


def _unpack(body: bytes, what: str) -> list:
    try:
        message = msgpack.unpackb(body, raw=False, use_list=True)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ProtocolError(f"store {what} is not valid msgpack: {exc}") from exc
    if not isinstance(message, list) or not message or not is_int(message[0]):
        raise ProtocolError(f"store {what} is not a list starting with an int code")
    return message


def decode_request(body: bytes) -> tuple[int, list]:
    """Return ``(op, args)`` of a request body, its argument types checked.

    Raises:
        ProtocolError: not msgpack, unknown op, or wrong arguments.
    """
    op, *args = _unpack(body, "request")
    checks = _SIGNATURES.get(op)
    if checks is None:
        raise ProtocolError(f"store request has unknown op {op}")
    if len(args) != len(checks) or not all(ok(a) for ok, a in zip(checks, args)):
        raise ProtocolError(f"store request {OP_NAMES[op]} has malformed arguments")
    return op, args


def decode_response(body: bytes) -> tuple[int, Any]:
    """Return ``(status, value)`` of a reply body.

    Raises:
        ProtocolError: not msgpack, or not ``[status, value]`` with a known status.
    """
    message = _unpack(body, "reply")
    if len(message) != 2 or message[0] not in (STATUS_OK, STATUS_TIMEOUT, STATUS_INVALID, STATUS_DENIED):
        raise ProtocolError(f"store reply is malformed: {message[:3]!r}")
    return message[0], message[1]

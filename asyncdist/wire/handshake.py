"""The connection handshake: only the job's own ranks may connect (sans-I/O).

Every connection between two ranks starts with five small messages::

    dialer                                   acceptor
      HELLO      magic, version, job, rank, to, nonce_d ->
             <-  CHALLENGE  magic, version, nonce_a, mac_a
      AUTH       mac_d, memory_d                        ->
             <-  WELCOME    mac_w, memory_a, reads
      READS      reads                                  ->

``mac_a = HMAC(secret, "acceptor" | nonce_d | nonce_a | job | ranks)``
proves to the dialer that it reached the rank it dialed, of its own job;
``mac_d = HMAC(secret, "dialer" | nonce_a | nonce_d | job | ranks | memory_d)``
proves the same the other way. Fresh nonces on both sides make a recorded
handshake useless for a replay. The secret never crosses the wire.

Nothing about the acceptor's job or process goes to a peer that has not
proven the secret: the CHALLENGE holds only a nonce and a MAC, a REJECT never
names the acceptor's job or rank, and the acceptor's pid and memory probe
travel in the WELCOME, after the dialer's AUTH. The dialer's own details
(its job and rank, in the HELLO) go only to the address the job's store gave
it, and its probe only in the AUTH, after the acceptor proved the secret.

Each side shows, once the other is authenticated, where a probe of its
memory lies (``memory``, a :class:`MemoryToken`, covered by a MAC: the
dialer's by ``mac_d``, the acceptor's by ``mac_w = HMAC(secret, "welcome" |
nonce_d | nonce_a | job | ranks | memory_a)``). The other side tries to read
that probe and says in its next message (``reads``) whether it could: a rank
sends large payloads by memory only to a peer that can read it. The token's
format is the wire's; offering a token and reading a peer's probe is I/O, so
the transport passes it in (:class:`SameHostMemory`, implemented by
:mod:`asyncdist.transport.cma`).

Handshake messages are length-prefixed msgpack maps of at most
:data:`MAX_HANDSHAKE_BYTES`, so a stranger's bytes (an HTTP request, random
noise) fail the length check before anything is allocated. Nothing here
touches a socket or a clock; :mod:`asyncdist.transport.connect` does the I/O.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass
from typing import Protocol, TypedDict, TypeGuard, TypeVar

import msgpack

from ..errors import FrameTooLargeError, HandshakeError, ProtocolError
from .frames import PREFIX

__all__ = [
    "MAGIC",
    "PROTOCOL_VERSION",
    "MAX_HANDSHAKE_BYTES",
    "HANDSHAKE_SECONDS",
    "Identity",
    "MemoryToken",
    "PeerMemoryReader",
    "SameHostMemory",
    "PeerAccess",
    "Dialer",
    "Acceptor",
    "encode_message",
    "message_length",
    "decode_message",
    "reject_message",
    "token_bytes",
    "valid_token",
]

MAGIC = "asyncdist"
PROTOCOL_VERSION = 4
# The largest handshake message; real ones are ~150 bytes.
MAX_HANDSHAKE_BYTES = 4096
#: Seconds an accepted connection has to finish the handshake. Two ranks of a
#: job finish it in milliseconds, also under load; a few seconds bounds how
#: long a stranger holds a socket (and a slot among the pending handshakes).
HANDSHAKE_SECONDS = 5.0
_NONCE_BYTES = 16
#: Bytes of a memory probe: random, so that reading them back proves access.
PROBE_BYTES = 16


class MemoryToken(TypedDict):
    """What a rank shows of itself in the handshake: where its probe lies."""

    pid: int
    addr: int
    probe: bytes


class PeerMemoryReader(Protocol):
    """Read access to an authenticated peer's memory (the transport's)."""

    def read_into(self, dest: memoryview, addr: int) -> None: ...


class SameHostMemory(Protocol):
    """What the handshake needs of the transport's same-host memory access."""

    def local_token(self) -> MemoryToken | None:
        """This process's probe to offer (None: the transport is off)."""
        ...

    def probe(self, token: MemoryToken) -> PeerMemoryReader | None:
        """Read a valid peer token's probe; how to read its memory, or None."""
        ...


def token_bytes(token: MemoryToken | None) -> bytes:
    """A canonical encoding of ``token``, for the handshake's MACs."""
    if token is None:
        return b"-"
    return b"%d:%d:%s" % (token["pid"], token["addr"], token["probe"].hex().encode())


def valid_token(token: object) -> TypeGuard[MemoryToken]:
    """Whether ``token`` (from the wire) has the fields and types of a MemoryToken."""
    return (
        isinstance(token, dict)
        and type(token.get("pid")) is int
        and type(token.get("addr")) is int
        and isinstance(token.get("probe"), bytes)
        and len(token["probe"]) == PROBE_BYTES
        and token["pid"] > 0
        and token["addr"] > 0
    )


@dataclass(frozen=True, slots=True)
class Identity:
    """Who this rank is, for the handshake.

    Attributes:
        job_id: the job's identifier, the same on every rank.
        rank: this process's global rank.
        world_size: the number of ranks in the job.
        secret: the job's shared secret (never sent).
    """

    job_id: str
    rank: int
    world_size: int
    secret: bytes


def encode_message(fields: dict) -> bytes:
    """Frame a handshake message: 4-byte length prefix + msgpack map."""
    body = msgpack.packb(fields, use_bin_type=True)
    return PREFIX.pack(len(body)) + body


def message_length(prefix: bytes) -> int:
    """Return the body length announced by a 4-byte prefix, checked against the limit."""
    (length,) = PREFIX.unpack(prefix)
    if length > MAX_HANDSHAKE_BYTES:
        raise FrameTooLargeError(
            f"handshake message of {length} bytes exceeds the limit of {MAX_HANDSHAKE_BYTES} bytes "
            "(not an asyncdist peer?)"
        )
    return length


def decode_message(body: bytes, expected: str) -> dict:
    """Parse a handshake message body and check its type.

    Raises:
        HandshakeError: malformed, or not the ``expected`` message type; a
            REJECT message raises with the acceptor's reason.
    """
    try:
        fields = msgpack.unpackb(body, raw=False, max_str_len=1024, max_bin_len=256, max_array_len=16, max_map_len=16)
    except Exception as exc:
        raise HandshakeError(f"malformed handshake message: {exc!r}") from exc
    if not isinstance(fields, dict):
        raise HandshakeError("malformed handshake message: not a map")
    kind = fields.get("type")
    if kind == "REJECT" and expected != "REJECT":
        raise HandshakeError(f"connection refused by the peer: {fields.get('reason', '?')}")
    if kind != expected:
        raise HandshakeError(f"expected a {expected} handshake message, got {kind!r:.40}")
    return fields


def reject_message(reason: str) -> bytes:
    """The message an acceptor sends before closing a connection it refuses."""
    return encode_message({"type": "REJECT", "reason": reason})


def _mac(secret: bytes, role: bytes, *parts: bytes) -> bytes:
    return hmac.new(secret, role + b"|" + b"|".join(parts), hashlib.sha256).digest()


_T = TypeVar("_T")


def _field(fields: dict, name: str, kind: type[_T]) -> _T:
    value = fields.get(name)
    if type(value) is not kind:
        raise HandshakeError(f"handshake field {name!r} is missing or not {kind.__name__}")
    return value


def _check_speaker(fields: dict) -> None:
    """Check the magic and version of a HELLO or CHALLENGE."""
    if fields.get("magic") != MAGIC:
        raise HandshakeError("not an asyncdist peer (bad magic)")
    version = fields.get("version")
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise HandshakeError(f"protocol version mismatch: this rank speaks {PROTOCOL_VERSION}, the peer {version!r}")


def _check_hello(fields: dict, me: Identity) -> tuple[int, int]:
    """Check a HELLO's magic, version and job; return the rank it claims and the one it dialed.

    Every reason goes back to a peer that has not authenticated, so none names
    this rank's job, rank or world size (docs/reliability.md: the job id is
    not secret, but a rank does not tell a stranger which job it serves).
    Whether the claimed ranks fit this rank is checked only once the peer has
    proven the secret (:func:`_check_claims`): a stranger who knows the job
    id gets the same CHALLENGE whatever ranks it claims, so it cannot learn
    the world size or this rank's number from which claims pass.
    """
    _check_speaker(fields)
    job = fields.get("job")
    if job != me.job_id:
        raise HandshakeError(f"job id mismatch: the peer's job {job!r:.80} is not this rank's")
    return _field(fields, "rank", int), _field(fields, "to", int)


def _check_claims(rank: int, to: int, me: Identity) -> None:
    """Check an authenticated peer's claims: its rank is another of this job's, and it dialed this rank."""
    if not 0 <= rank < me.world_size or rank == me.rank:
        raise HandshakeError(f"the peer claims rank {rank}, not a valid peer of this rank")
    if to != me.rank:
        raise HandshakeError(f"the peer dialed rank {to}, and this is another rank (a stale address?)")


def _memory(token: object) -> bytes:
    """A peer's memory token from the wire as its MAC covers it (malformed: as absent)."""
    return token_bytes(token if valid_token(token) else None)


def _pair(a: int, b: int) -> bytes:
    return f"{a}>{b}".encode()


class PeerAccess:
    """What both sides learn about the peer's memory (see the module docstring).

    Attributes:
        peer_memory: how to read the peer's memory, None if this rank cannot.
        peer_reads_me: whether the peer said it can read this rank's memory.
    """

    def __init__(self, me: Identity, memory: SameHostMemory | None, nonce: bytes | None) -> None:
        self._me = me
        self._access = memory
        self._memory = memory.local_token() if memory is not None else None
        self._nonce = nonce if nonce is not None else os.urandom(_NONCE_BYTES)
        self._peer_nonce = b""
        self.peer_memory: PeerMemoryReader | None = None
        self.peer_reads_me = False

    def _probe(self, token: object) -> None:
        """Try the authenticated peer's probe."""
        if self._access is not None and self._memory is not None and valid_token(token):
            self.peer_memory = self._access.probe(token)

    def _mac(self, role: bytes, first: bytes, second: bytes, pair: bytes, *memory: bytes) -> bytes:
        """The MAC of one role over this session's nonces, job and rank pair."""
        return _mac(self._me.secret, role, first, second, self._me.job_id.encode(), pair, *memory)

    def _reads(self, fields: dict) -> bool:
        """Whether the peer says (in ``fields``) that it reads this rank's memory."""
        return self._memory is not None and fields.get("reads") is True


class Dialer(PeerAccess):
    """The dialing side's state machine: hello -> on_challenge -> on_verdict.

    ``memory``: the transport's same-host memory access, to offer this
    process's memory and read the peer's; None not to.
    """

    def __init__(
        self, me: Identity, expected_peer: int, nonce: bytes | None = None, memory: SameHostMemory | None = None
    ) -> None:
        super().__init__(me, memory, nonce)
        self._expected_peer = expected_peer
        self._pair = _pair(me.rank, expected_peer)

    def hello(self) -> bytes:
        """The first message to send."""
        me = self._me
        return encode_message(
            {
                "type": "HELLO",
                "magic": MAGIC,
                "version": PROTOCOL_VERSION,
                "job": me.job_id,
                "rank": me.rank,
                "to": self._expected_peer,
                "nonce": self._nonce,
            }
        )

    def on_challenge(self, body: bytes) -> bytes:
        """Verify the acceptor; return the AUTH message to send (with this rank's probe)."""
        fields = decode_message(body, "CHALLENGE")
        _check_speaker(fields)
        nonce = _field(fields, "nonce", bytes)
        expected = self._mac(b"acceptor", self._nonce, nonce, self._pair)
        if not hmac.compare_digest(expected, _field(fields, "mac", bytes)):
            raise HandshakeError(
                f"rank {self._expected_peer} failed authentication (different job secret, or not rank "
                f"{self._expected_peer} of this job?)"
            )
        self._peer_nonce = nonce
        mac = self._mac(b"dialer", nonce, self._nonce, self._pair, token_bytes(self._memory))
        return encode_message({"type": "AUTH", "mac": mac, "memory": self._memory})

    def on_verdict(self, body: bytes) -> bytes:
        """Accept a WELCOME (its probe checked against ``mac_w`` and tried);
        return the READS message to send. A REJECT raises :class:`HandshakeError`
        with its reason."""
        fields = decode_message(body, "WELCOME")
        if not self._peer_nonce:
            raise ProtocolError("WELCOME before CHALLENGE")
        token = fields.get("memory")
        expected = self._mac(b"welcome", self._nonce, self._peer_nonce, self._pair, _memory(token))
        if not hmac.compare_digest(expected, _field(fields, "mac", bytes)):
            raise HandshakeError(f"rank {self._expected_peer}'s WELCOME failed authentication (altered in transit?)")
        self._probe(token)
        self.peer_reads_me = self._reads(fields)
        return encode_message({"type": "READS", "reads": self.peer_memory is not None})


class Acceptor(PeerAccess):
    """The accepting side's state machine: on_hello -> on_auth -> on_reads.

    After ``on_auth`` returns, :attr:`peer_rank` is the authenticated rank.
    ``memory`` as for :class:`Dialer`.
    """

    def __init__(self, me: Identity, nonce: bytes | None = None, memory: SameHostMemory | None = None) -> None:
        super().__init__(me, memory, nonce)
        self.peer_rank = -1
        self._claimed: tuple[int, int] | None = None  # (its rank, the rank it dialed), from the HELLO
        self._authenticated = False

    def on_hello(self, body: bytes) -> bytes:
        """Check the dialer's HELLO; return the CHALLENGE message to send.

        The MACs cover the pair of ranks the dialer names, so a peer that
        dialed a stale address authenticates and is then told so.
        """
        fields = decode_message(body, "HELLO")
        claimed = _check_hello(fields, self._me)
        peer_nonce = _field(fields, "nonce", bytes)
        if len(peer_nonce) < _NONCE_BYTES:
            raise HandshakeError("handshake nonce too short")
        self._peer_nonce = peer_nonce
        self._claimed = claimed
        mac = self._mac(b"acceptor", peer_nonce, self._nonce, _pair(*claimed))
        return encode_message(
            {"type": "CHALLENGE", "magic": MAGIC, "version": PROTOCOL_VERSION, "nonce": self._nonce, "mac": mac}
        )

    def on_auth(self, body: bytes) -> bytes:
        """Verify the dialer's AUTH and its claims, and try its probe; return the
        WELCOME message to send (with this rank's probe, now that the dialer is
        authenticated)."""
        if self._claimed is None:
            raise ProtocolError("AUTH before HELLO")
        fields = decode_message(body, "AUTH")
        token = fields.get("memory")
        rank, to = self._claimed
        pair = _pair(rank, to)
        expected = self._mac(b"dialer", self._nonce, self._peer_nonce, pair, _memory(token))
        if not hmac.compare_digest(expected, _field(fields, "mac", bytes)):
            raise HandshakeError(f"a peer claiming rank {rank} failed authentication (wrong job secret)")
        _check_claims(rank, to, self._me)
        self.peer_rank = rank
        self._authenticated = True
        self._probe(token)
        mac = self._mac(b"welcome", self._peer_nonce, self._nonce, pair, token_bytes(self._memory))
        return encode_message(
            {"type": "WELCOME", "mac": mac, "memory": self._memory, "reads": self.peer_memory is not None}
        )

    def on_reads(self, body: bytes) -> None:
        """Read the dialer's READS: whether it can read this rank's memory."""
        if not self._authenticated:
            raise ProtocolError("READS before AUTH")
        self.peer_reads_me = self._reads(decode_message(body, "READS"))

"""Tests for asyncdist.wire.handshake: a Dialer and an Acceptor wired together in
memory, each one's output fed to the other, and every way a stranger, a rank
of another job or a replay is refused.

Messages travel as they would on a socket: a 4-byte prefix read with
``message_length``, then the body.
"""

from __future__ import annotations

import hashlib
import hmac

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncdist.errors import FrameTooLargeError, HandshakeError, ProtocolError
from asyncdist.wire.handshake import (
    MAGIC,
    MAX_HANDSHAKE_BYTES,
    PROTOCOL_VERSION,
    Acceptor,
    Dialer,
    Identity,
    MemoryToken,
    decode_message,
    encode_message,
    message_length,
    reject_message,
    token_bytes,
)
from asyncdist.transport import cma
from asyncdist.transport.cma import SAME_HOST
from asyncdist.wire.frames import PREFIX

SECRET = b"job-secret-0123456789abcdef"
JOB = "job-42"
WORLD = 4
NONCE_D = bytes(range(16))
NONCE_A = bytes(range(100, 116))


def me(rank: int, *, job: str = JOB, secret: bytes = SECRET, world: int = WORLD) -> Identity:
    return Identity(job_id=job, rank=rank, world_size=world, secret=secret)


def body(message: bytes) -> bytes:
    """What the reading side hands the state machine: the body after the prefix."""
    length = message_length(message[: PREFIX.size])
    assert len(message) == PREFIX.size + length
    return message[PREFIX.size :]


def handshake(dialer: Dialer, acceptor: Acceptor) -> list[bytes]:
    """Run the five messages through both sides; return them as sent."""
    hello = dialer.hello()
    challenge = acceptor.on_hello(body(hello))
    auth = dialer.on_challenge(body(challenge))
    welcome = acceptor.on_auth(body(auth))
    reads = dialer.on_verdict(body(welcome))
    acceptor.on_reads(body(reads))
    return [hello, challenge, auth, welcome, reads]


def hello_fields(**overrides) -> dict:
    fields = {
        "type": "HELLO", "magic": MAGIC, "version": PROTOCOL_VERSION, "job": JOB, "rank": 1, "to": 0,
        "nonce": NONCE_D,
    }  # fmt: skip
    fields.update(overrides)
    return {k: v for k, v in fields.items() if v is not ...}


def challenge_from(acceptor_rank: int, dialer_rank: int, **acceptor_kw) -> bytes:
    """A genuine CHALLENGE body from an acceptor, answering a HELLO with NONCE_D."""
    dialer = Dialer(me(dialer_rank, **acceptor_kw), expected_peer=acceptor_rank, nonce=NONCE_D)
    return body(Acceptor(me(acceptor_rank, **acceptor_kw), nonce=NONCE_A).on_hello(body(dialer.hello())))


def reference_mac(
    role: bytes, first: bytes, second: bytes, dialer: int, acceptor: int, secret: bytes = SECRET, memory: bytes = b"-"
) -> bytes:
    """The MAC as the module docstring documents it, computed independently
    (``memory``: the sender's memory token as ``pid:addr:probe-hex``, "-" for
    none; the acceptor's CHALLENGE MAC covers no token)."""
    parts = [role, first, second, JOB.encode(), f"{dialer}>{acceptor}".encode()]
    message = b"|".join(parts if role == b"acceptor" else [*parts, memory])
    return hmac.new(secret, message, hashlib.sha256).digest()


# -- success -------------------------------------------------------------------


@pytest.mark.parametrize(("dialer_rank", "acceptor_rank"), [(d, a) for d in range(3) for a in range(3) if d != a])
def test_success_gives_acceptor_the_dialer_rank(dialer_rank: int, acceptor_rank: int) -> None:
    acceptor = Acceptor(me(acceptor_rank, world=3))
    assert acceptor.peer_rank == -1
    messages = handshake(Dialer(me(dialer_rank, world=3), expected_peer=acceptor_rank), acceptor)
    assert acceptor.peer_rank == dialer_rank
    for message in messages:
        assert SECRET not in message  # the secret never crosses the wire
        assert len(message) <= PREFIX.size + MAX_HANDSHAKE_BYTES


def test_messages_carry_the_documented_fields_and_macs() -> None:
    hello, challenge, auth, welcome, reads = handshake(
        Dialer(me(2), expected_peer=0, nonce=NONCE_D, memory=None), Acceptor(me(0), nonce=NONCE_A, memory=None)
    )
    assert msgpack.unpackb(body(hello)) == hello_fields(rank=2)
    assert msgpack.unpackb(body(challenge)) == {
        "type": "CHALLENGE", "magic": MAGIC, "version": PROTOCOL_VERSION,
        "nonce": NONCE_A, "mac": reference_mac(b"acceptor", NONCE_D, NONCE_A, dialer=2, acceptor=0),
    }  # fmt: skip
    assert msgpack.unpackb(body(auth)) == {
        "type": "AUTH", "mac": reference_mac(b"dialer", NONCE_A, NONCE_D, dialer=2, acceptor=0), "memory": None,
    }  # fmt: skip
    assert msgpack.unpackb(body(welcome)) == {
        "type": "WELCOME", "mac": reference_mac(b"welcome", NONCE_D, NONCE_A, dialer=2, acceptor=0), "memory": None,
        "reads": False,
    }  # fmt: skip
    assert msgpack.unpackb(body(reads)) == {"type": "READS", "reads": False}


@pytest.mark.parametrize("memory", [None, SAME_HOST], ids=["no-memory", "same-host"])
def test_nothing_of_the_acceptor_reaches_a_peer_before_it_proves_the_secret(memory) -> None:
    # What a stranger that knows the job id (not secret) gets back: the CHALLENGE,
    # then a REJECT for its AUTH. No pid, probe address or bytes, job id or rank.
    acceptor = Acceptor(me(0), memory=memory)
    challenge = acceptor.on_hello(body(encode_message(hello_fields(rank=1))))
    assert set(msgpack.unpackb(body(challenge))) == {"type", "magic", "version", "nonce", "mac"}
    with pytest.raises(HandshakeError) as refused:
        acceptor.on_auth(body(encode_message({"type": "AUTH", "mac": bytes(32), "memory": None})))
    reject = reject_message(str(refused.value))
    token = cma.local_token()
    for sent in (challenge, reject):
        assert JOB.encode() not in sent
        if token is not None:
            assert token["probe"] not in sent
    assert "rank 0" not in str(refused.value) and str(WORLD) not in str(refused.value)


@pytest.mark.parametrize("memory", [None, SAME_HOST], ids=["no-memory", "same-host"])
def test_the_dialer_shows_its_probe_only_to_an_authenticated_acceptor(memory) -> None:
    dialer = Dialer(me(1), expected_peer=0, memory=memory)
    hello = dialer.hello()
    assert set(msgpack.unpackb(body(hello))) == {"type", "magic", "version", "job", "rank", "to", "nonce"}
    forged = Acceptor(me(0, secret=b"a stranger's guess")).on_hello(body(hello))
    with pytest.raises(HandshakeError, match="rank 0 failed authentication"):
        dialer.on_challenge(body(forged))


def test_messages_out_of_order_are_protocol_errors() -> None:
    with pytest.raises(ProtocolError, match="WELCOME before CHALLENGE"):
        Dialer(me(1), expected_peer=0).on_verdict(body(encode_message({"type": "WELCOME", "mac": bytes(32)})))
    acceptor = Acceptor(me(0))
    acceptor.on_hello(body(encode_message(hello_fields(rank=1))))
    with pytest.raises(ProtocolError, match="READS before AUTH"):
        acceptor.on_reads(body(encode_message({"type": "READS", "reads": True})))


class Offering:
    """The transport's memory access, offering ``token`` instead of its own."""

    def __init__(self, token: MemoryToken) -> None:
        self.token = token

    def local_token(self) -> MemoryToken:
        return self.token

    def probe(self, token: MemoryToken) -> cma.PeerMemory | None:
        return SAME_HOST.probe(token)


requires_cma = pytest.mark.skipif(cma.local_token() is None, reason="cross-memory attach unavailable here")


@requires_cma
def test_ranks_that_can_read_each_others_memory_learn_it_both_ways() -> None:
    token = cma.local_token()
    dialer = Dialer(me(1), expected_peer=0, nonce=NONCE_D, memory=SAME_HOST)
    acceptor = Acceptor(me(0), nonce=NONCE_A, memory=SAME_HOST)
    _, _, auth, welcome, reads = handshake(dialer, acceptor)
    for side in (dialer, acceptor):
        assert side.peer_memory == cma.PeerMemory(token["pid"]) and side.peer_reads_me
    assert msgpack.unpackb(body(welcome))["reads"] is True and msgpack.unpackb(body(reads))["reads"] is True
    # Each side's memory token is covered by its MAC: the dialer's AUTH, the acceptor's WELCOME.
    memory = token_bytes(token)
    assert msgpack.unpackb(body(welcome))["mac"] == reference_mac(
        b"welcome", NONCE_D, NONCE_A, dialer=1, acceptor=0, memory=memory
    )
    assert msgpack.unpackb(body(auth))["mac"] == reference_mac(
        b"dialer", NONCE_A, NONCE_D, dialer=1, acceptor=0, memory=memory
    )


@requires_cma
@pytest.mark.parametrize("offered", [(True, False), (False, True), (False, False)])
def test_memory_is_used_only_where_both_sides_offer_it(offered: tuple[bool, bool]) -> None:
    dialer = Dialer(me(1), expected_peer=0, memory=SAME_HOST if offered[0] else None)
    acceptor = Acceptor(me(0), memory=SAME_HOST if offered[1] else None)
    handshake(dialer, acceptor)
    assert (dialer.peer_memory, dialer.peer_reads_me, acceptor.peer_memory, acceptor.peer_reads_me) == (
        None, False, None, False,
    )  # fmt: skip


@requires_cma
def test_a_probe_that_does_not_read_back_means_no_memory_access() -> None:
    # What a peer in another PID namespace or on another host looks like:
    # its token names memory that is not there (or holds other bytes) here.
    token = cma.local_token()
    wrong = {**token, "probe": bytes(16)}
    dialer = Dialer(me(1), expected_peer=0, memory=Offering(wrong))
    acceptor = Acceptor(me(0), memory=SAME_HOST)
    handshake(dialer, acceptor)
    assert acceptor.peer_memory is None and not dialer.peer_reads_me  # nobody reads the dialer
    assert dialer.peer_memory is not None and acceptor.peer_reads_me  # the acceptor's probe is genuine


@requires_cma
def _altered(message: bytes) -> bytes:
    """``message`` with its memory token pointing the reader's reads elsewhere."""
    fields = msgpack.unpackb(body(message))
    fields["memory"] = {**fields["memory"], "pid": 1}
    return msgpack.packb(fields, use_bin_type=True)


@requires_cma
def test_a_memory_token_altered_in_transit_fails_authentication() -> None:
    dialer = Dialer(me(1), expected_peer=0, memory=SAME_HOST)
    acceptor = Acceptor(me(0), memory=SAME_HOST)
    auth = dialer.on_challenge(body(acceptor.on_hello(body(dialer.hello()))))
    with pytest.raises(HandshakeError, match="claiming rank 1 failed authentication"):
        acceptor.on_auth(_altered(auth))  # the dialer's token, in its AUTH
    dialer = Dialer(me(1), expected_peer=0, memory=SAME_HOST)
    acceptor = Acceptor(me(0), memory=SAME_HOST)
    welcome = acceptor.on_auth(body(dialer.on_challenge(body(acceptor.on_hello(body(dialer.hello()))))))
    with pytest.raises(HandshakeError, match="rank 0's WELCOME failed authentication"):
        dialer.on_verdict(_altered(welcome))  # the acceptor's token, in its WELCOME


def test_fresh_nonces_by_default() -> None:
    hellos = {msgpack.unpackb(body(Dialer(me(1), expected_peer=0).hello()))["nonce"] for _ in range(8)}
    assert len(hellos) == 8 and all(len(n) >= 16 for n in hellos)


# -- authentication --------------------------------------------------------------


def test_acceptor_with_wrong_secret_is_refused_by_the_dialer() -> None:
    dialer = Dialer(me(1), expected_peer=0)
    acceptor = Acceptor(me(0, secret=b"another secret"))
    challenge = acceptor.on_hello(body(dialer.hello()))
    with pytest.raises(HandshakeError, match="rank 0 failed authentication"):
        dialer.on_challenge(body(challenge))


@pytest.mark.parametrize("forged", ["wrong secret", "zeros", "truncated"])
def test_dialer_with_wrong_secret_is_refused_by_the_acceptor(forged: str) -> None:
    # A dialer without the secret cannot pass the dialer's own check of the
    # CHALLENGE, so it is played by hand: it answers with the MAC it can make.
    acceptor = Acceptor(me(0), nonce=NONCE_A)
    acceptor.on_hello(body(encode_message(hello_fields(rank=1))))
    good = reference_mac(b"dialer", NONCE_A, NONCE_D, dialer=1, acceptor=0)
    mac = {
        "wrong secret": reference_mac(b"dialer", NONCE_A, NONCE_D, dialer=1, acceptor=0, secret=b"guess"),
        "zeros": bytes(32),
        "truncated": good[:16],
    }[forged]
    with pytest.raises(HandshakeError, match="claiming rank 1 failed authentication"):
        acceptor.on_auth(body(encode_message({"type": "AUTH", "mac": mac})))
    # The reference MAC itself is accepted, so the refusal above is about the MAC.
    welcome = acceptor.on_auth(body(encode_message({"type": "AUTH", "mac": good})))
    assert msgpack.unpackb(body(welcome))["type"] == "WELCOME"


def test_replayed_auth_from_another_session_fails() -> None:
    recorded = handshake(Dialer(me(1), expected_peer=0), Acceptor(me(0)))
    hello, _, auth, _, _ = recorded
    replay = Acceptor(me(0))  # a fresh session: a new acceptor nonce
    replay.on_hello(body(hello))
    with pytest.raises(HandshakeError, match="failed authentication"):
        replay.on_auth(body(auth))


def test_replayed_challenge_from_another_session_fails() -> None:
    _, challenge, _, _, _ = handshake(Dialer(me(1), expected_peer=0), Acceptor(me(0)))
    dialer = Dialer(me(1), expected_peer=0)  # a new dialer nonce
    dialer.hello()
    with pytest.raises(HandshakeError, match="failed authentication"):
        dialer.on_challenge(body(challenge))


def test_auth_for_another_rank_pair_fails() -> None:
    # A genuine AUTH MAC of the pair 1>0 does not authenticate rank 2 on the same nonces.
    acceptor = Acceptor(me(0), nonce=NONCE_A)
    acceptor.on_hello(body(encode_message(hello_fields(rank=2))))
    mac = reference_mac(b"dialer", NONCE_A, NONCE_D, dialer=1, acceptor=0)
    with pytest.raises(HandshakeError, match="failed authentication"):
        acceptor.on_auth(body(encode_message({"type": "AUTH", "mac": mac})))


def test_acceptor_mac_reflected_as_auth_fails() -> None:
    # Sending the acceptor's own CHALLENGE MAC back as AUTH proves nothing.
    acceptor = Acceptor(me(0), nonce=NONCE_A)
    challenge = msgpack.unpackb(body(acceptor.on_hello(body(encode_message(hello_fields(rank=1))))))
    with pytest.raises(HandshakeError, match="failed authentication"):
        acceptor.on_auth(body(encode_message({"type": "AUTH", "mac": challenge["mac"]})))


def test_auth_before_hello_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="AUTH before HELLO"):
        Acceptor(me(0)).on_auth(body(encode_message({"type": "AUTH", "mac": bytes(32)})))


# -- who is calling ----------------------------------------------------------------


def test_wrong_job_refused_by_acceptor() -> None:
    dialer = Dialer(me(1, job="other-job"), expected_peer=0)
    with pytest.raises(HandshakeError, match="job id mismatch.*'other-job'") as caught:
        Acceptor(me(0)).on_hello(body(dialer.hello()))
    assert "job-42" not in str(caught.value)  # the reason goes back to a stranger


def test_a_challenge_of_another_job_fails_authentication() -> None:
    challenge = challenge_from(0, 1, job="other-job")
    with pytest.raises(HandshakeError, match="rank 0 failed authentication"):
        Dialer(me(1), expected_peer=0, nonce=NONCE_D).on_challenge(challenge)


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ({"version": PROTOCOL_VERSION + 1}, "protocol version mismatch"),
        ({"version": 0}, "protocol version mismatch"),
        ({"version": "1"}, "protocol version mismatch"),
        ({"version": ...}, "protocol version mismatch"),
        ({"magic": "http"}, "bad magic"),
        ({"magic": MAGIC.encode()}, "bad magic"),
        ({"magic": ...}, "bad magic"),
        ({"job": ...}, "job id mismatch"),
        ({"rank": True}, "'rank' is missing or not int"),
        ({"rank": "1"}, "'rank' is missing or not int"),
        ({"rank": ...}, "'rank' is missing or not int"),
        ({"to": "0"}, "'to' is missing or not int"),
        ({"to": ...}, "'to' is missing or not int"),
        ({"nonce": NONCE_D[:15]}, "nonce too short"),
        ({"nonce": "x" * 16}, "'nonce' is missing or not bytes"),
        ({"nonce": ...}, "'nonce' is missing or not bytes"),
        ({"type": "AUTH"}, "expected a HELLO"),
        ({"type": ...}, "expected a HELLO"),
    ],
)
def test_bad_hello_refused(override: dict, match: str) -> None:
    acceptor = Acceptor(me(0))
    acceptor.on_hello(body(encode_message(hello_fields())))  # the unmodified HELLO passes
    acceptor = Acceptor(me(0))
    with pytest.raises(HandshakeError, match=match):
        acceptor.on_hello(body(encode_message(hello_fields(**override))))
    assert acceptor.peer_rank == -1


@pytest.mark.parametrize(
    ("rank", "to", "match"),
    [
        (WORLD, 0, "claims rank 4, not a valid peer"),
        (-1, 0, "claims rank -1, not a valid peer"),
        (0, 0, "claims rank 0, not a valid peer"),  # the acceptor's own rank
        (2**63, 0, "claims rank 9223372036854775808, not a valid peer"),
        (1, 2, "dialed rank 2, and this is another rank"),
        (1, WORLD + 5, "dialed rank 9, and this is another rank"),
    ],
)
def test_claims_that_do_not_fit_are_refused_once_the_peer_has_proven_the_secret(rank: int, to: int, match: str) -> None:
    # The acceptor is rank 0 of 4; the dialer holds the secret and claims (rank, to).
    dialer = Dialer(me(rank), expected_peer=to, nonce=NONCE_D)
    acceptor = Acceptor(me(0), nonce=NONCE_A)
    auth = dialer.on_challenge(body(acceptor.on_hello(body(dialer.hello()))))
    with pytest.raises(HandshakeError, match=match):
        acceptor.on_auth(body(auth))
    assert acceptor.peer_rank == -1


def test_a_stranger_learns_nothing_from_which_claims_get_a_challenge() -> None:
    # Knowing the job id but not the secret, it tries every (rank, to): each gets
    # the same kind of CHALLENGE, and each AUTH fails alike, so no claim tells it
    # the world size or the acceptor's rank.
    outcomes = set()
    for rank in range(-1, WORLD + 2):
        for to in range(-1, WORLD + 2):
            stranger = Dialer(me(rank, secret=b"guess"), expected_peer=to, nonce=NONCE_D)
            acceptor = Acceptor(me(2), nonce=NONCE_A)
            challenge = decode_message(body(acceptor.on_hello(body(stranger.hello()))), "CHALLENGE")
            with pytest.raises(HandshakeError) as refused:  # its own check of the acceptor's MAC fails
                stranger.on_challenge(msgpack.packb(challenge, use_bin_type=True))
            auth = encode_message({"type": "AUTH", "mac": bytes(32), "memory": None})
            with pytest.raises(HandshakeError) as auth_refused:
                acceptor.on_auth(body(auth))
            reason = str(auth_refused.value).replace(f"rank {rank}", "rank R")
            outcomes.add((tuple(sorted(challenge)), "failed authentication" in str(refused.value), reason))
    assert outcomes == {(("mac", "magic", "nonce", "type", "version"), True,
                         "a peer claiming rank R failed authentication (wrong job secret)")}


def _challenge_with(**overrides) -> bytes:
    fields = msgpack.unpackb(challenge_from(0, 1))
    fields.update(overrides)
    return msgpack.packb(fields, use_bin_type=True)


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ({"version": PROTOCOL_VERSION + 1}, "protocol version mismatch"),
        ({"magic": "nope"}, "bad magic"),
        ({"mac": "x"}, "'mac' is missing or not bytes"),
        ({"nonce": 5}, "'nonce' is missing or not bytes"),
        ({"type": "WELCOME"}, "expected a CHALLENGE"),
    ],
)
def test_bad_challenge_refused(override: dict, match: str) -> None:
    Dialer(me(1), expected_peer=0, nonce=NONCE_D).on_challenge(_challenge_with())  # unmodified passes
    with pytest.raises(HandshakeError, match=match):
        Dialer(me(1), expected_peer=0, nonce=NONCE_D).on_challenge(_challenge_with(**override))


def test_dialer_expecting_rank_1_refuses_rank_2() -> None:
    challenge = challenge_from(acceptor_rank=2, dialer_rank=0)  # a MAC for the pair 0>2
    with pytest.raises(HandshakeError, match="rank 1 failed authentication .* not rank 1 of this job"):
        Dialer(me(0), expected_peer=1, nonce=NONCE_D).on_challenge(challenge)
    dialer, acceptor = Dialer(me(0), expected_peer=1), Acceptor(me(2))  # a stale address: rank 2 answers
    auth = dialer.on_challenge(body(acceptor.on_hello(body(dialer.hello()))))
    with pytest.raises(HandshakeError, match="dialed rank 1, and this is another rank") as refused:
        acceptor.on_auth(body(auth))
    assert "rank 2" not in str(refused.value)


# -- REJECT and length limits -----------------------------------------------------


def test_reject_makes_the_dialer_raise_with_the_reason() -> None:
    dialer = Dialer(me(1), expected_peer=0)
    dialer.on_challenge(body(Acceptor(me(0)).on_hello(body(dialer.hello()))))
    reject = reject_message("rank 1 is already connected")
    with pytest.raises(HandshakeError, match="connection refused by the peer: rank 1 is already connected"):
        dialer.on_verdict(body(reject))
    with pytest.raises(HandshakeError, match="refused by the peer: rank 1 is already connected"):
        Dialer(me(1), expected_peer=0).on_challenge(body(reject))
    assert decode_message(body(reject), "REJECT") == {"type": "REJECT", "reason": "rank 1 is already connected"}


def test_verdict_must_be_welcome() -> None:
    with pytest.raises(HandshakeError, match="expected a WELCOME"):
        Dialer(me(1), expected_peer=0).on_verdict(body(encode_message({"type": "AUTH"})))


@pytest.mark.parametrize("length", [MAX_HANDSHAKE_BYTES + 1, 2**32 - 1])
def test_oversized_length_prefix(length: int) -> None:
    with pytest.raises(FrameTooLargeError, match=str(length)):
        message_length(PREFIX.pack(length))


def test_length_prefix_limits() -> None:
    assert message_length(PREFIX.pack(MAX_HANDSHAKE_BYTES)) == MAX_HANDSHAKE_BYTES
    assert message_length(PREFIX.pack(0)) == 0
    # A stranger speaking HTTP fails on its first four bytes.
    with pytest.raises(FrameTooLargeError, match="not an asyncdist peer"):
        message_length(b"GET ")


@pytest.mark.parametrize(
    "raw",
    [b"", b"\xc1", msgpack.packb([1, 2]), msgpack.packb("HELLO"), msgpack.packb(hello_fields())[:-1],
     msgpack.packb({"type": "HELLO", "pad": "x" * 2000})],
)  # fmt: skip
def test_malformed_message(raw: bytes) -> None:
    with pytest.raises(HandshakeError, match="malformed handshake message"):
        decode_message(raw, "HELLO")


# -- fuzz ----------------------------------------------------------------------

_values = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=False),
    st.text(max_size=20), st.binary(max_size=40), st.sampled_from([MAGIC, JOB, PROTOCOL_VERSION, 0, 1, 2, 3]),
)  # fmt: skip
_fields = st.dictionaries(
    st.sampled_from(["type", "magic", "version", "job", "rank", "to", "nonce", "mac", "reason", "x"]), _values,
    max_size=8,
)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=120))
def test_fuzz_bytes_into_on_hello(raw: bytes) -> None:
    try:
        Acceptor(me(0)).on_hello(raw)
    except ProtocolError:
        pass


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=120))
def test_fuzz_bytes_into_on_challenge(raw: bytes) -> None:
    with pytest.raises(ProtocolError):  # no bytes without the secret can pass
        Dialer(me(1), expected_peer=0).on_challenge(raw)


@settings(max_examples=300, deadline=None)
@given(_fields)
def test_fuzz_fields_into_on_hello(fields: dict) -> None:
    fields = hello_fields() | fields  # a valid HELLO with some fields replaced or added
    valid = (
        fields["type"] == "HELLO"
        and fields["magic"] == MAGIC
        and type(fields["version"]) is int  # see test_version_must_be_the_int_1
        and fields["version"] == PROTOCOL_VERSION
        and fields["job"] == JOB
        and type(fields["rank"]) is int  # any: whether it fits is checked after the AUTH
        and type(fields["to"]) is int
        and type(fields["nonce"]) is bytes
        and len(fields["nonce"]) >= 16
    )
    acceptor = Acceptor(me(0))
    try:
        acceptor.on_hello(msgpack.packb(fields, use_bin_type=True))
    except ProtocolError:
        assert not valid
    else:  # a HELLO carries no proof, so any well-formed one is answered
        assert valid
    assert acceptor.peer_rank == -1  # known only once the peer has authenticated


@pytest.mark.parametrize("version", [True, 1.0])
def test_version_must_be_the_int_1(version: object) -> None:
    with pytest.raises(HandshakeError, match="protocol version mismatch"):
        Acceptor(me(0)).on_hello(body(encode_message(hello_fields(version=version))))


@settings(max_examples=300, deadline=None)
@given(_fields)
def test_fuzz_fields_into_on_challenge(fields: dict) -> None:
    fields = {"type": "CHALLENGE", "magic": MAGIC, "version": PROTOCOL_VERSION, "job": JOB, "rank": 0} | fields
    with pytest.raises(ProtocolError):
        Dialer(me(1), expected_peer=0).on_challenge(msgpack.packb(fields, use_bin_type=True))

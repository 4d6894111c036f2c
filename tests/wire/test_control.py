"""Tests for asyncdist.wire.control: control frames as typed values and their headers
(no loop, no socket).

Each frame's bytes are compared with the header that protocol version 4 puts
on the wire for it, written out field by field here, so that a change to the
mapping is a change to the protocol and fails here.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncdist.errors import ProtocolError
from asyncdist.wire.control import (
    MAX_REASON_CHARS,
    Abort,
    Agree,
    Bye,
    ControlFrame,
    Done,
    Expel,
    Here,
    Ping,
    Revoke,
    RingAccepted,
    RingBack,
    RingOffer,
    RingRefused,
    Wake,
    Where,
    decode_control,
    encode_control,
)
from asyncdist.wire.frames import PREFIX, FrameDecoder, Header, Kind, decode_header, encode_header

# Each frame, and the header protocol version 4 carries it in:
# Header(kind, ctx, src, tag, seq, dtype, shape, nbytes, op).
ON_THE_WIRE: list[tuple[ControlFrame, Header]] = [
    (Bye(3, 15), Header(Kind.BYE, 0, 3, 15, 0, "uint8", (), 0, "")),
    (Bye(0), Header(Kind.BYE, 0, 0, 0, 0, "uint8", (), 0, "")),
    (Ping(7), Header(Kind.PING, 0, 7, 0, 0, "uint8", (), 0, "")),
    (Done(2), Header(Kind.DONE, 0, 2, 0, 0, "uint8", (), 0, "")),
    (Wake(5), Header(Kind.WAKE, 0, 5, 0, 0, "uint8", (), 0, "")),
    (Abort(2, 5, 9, "CollectiveMismatchError", "disagree"),
     Header(Kind.ABORT, 5, 2, 9, 9, "CollectiveMismatchError", (), 0, "disagree")),
    (Abort(1, 0, -4, "PeerLostError", "gone", lost=3),  # seq may not be negative: 0
     Header(Kind.ABORT, 0, 1, -4, 0, "PeerLostError", (3,), 0, "gone")),
    (Revoke(4, 77, 1), Header(Kind.REVOKE, 77, 4, 1, 0, "uint8", (), 0, "")),
    (Agree(1, 77, 6, 2, '{"f":1,"F":[]}'), Header(Kind.AGREE, 77, 1, 6, 2, "uint8", (), 0, '{"f":1,"F":[]}')),
    (Expel(0, "silent for 30 s"), Header(Kind.AGREE, 0, 0, -1, 0, "uint8", (), 0, "silent for 30 s")),
    (Where(3, 12, 8), Header(Kind.WHERE, 12, 3, 8, 0, "uint8", (), 0, "")),
    (Where(3, 12, 9, any_context=True), Header(Kind.WHERE, 12, 3, 9, 1, "uint8", (), 0, "")),
    (Here(0, 12, 8, '{"ctx": 12}'), Header(Kind.HERE, 12, 0, 8, 0, "uint8", (), 0, '{"ctx": 12}')),
    (RingOffer(1, 4242, 17, b"\x00\xab\xff", 1 << 20),
     Header(Kind.RING, 4242, 1, 17, 0, "uint8", (1 << 20,), 0, "00abff")),
    (RingAccepted(2), Header(Kind.RING, 0, 2, 0, 1, "uint8", (), 0, "")),
    (RingRefused(2), Header(Kind.RING, 0, 2, 0, 2, "uint8", (), 0, "")),
    (RingBack(2, 5), Header(Kind.RING, 0, 2, 5, 3, "uint8", (), 0, "")),
]


def _through_the_wire(frame: ControlFrame) -> ControlFrame:
    """``frame`` as the receiving rank's decoder gives it back."""
    encoded = encode_control(frame)
    (length,) = PREFIX.unpack_from(encoded)
    assert length == len(encoded) - PREFIX.size
    return decode_control(decode_header(encoded[PREFIX.size :]))


@pytest.mark.parametrize(("frame", "header"), ON_THE_WIRE, ids=[f"{type(f).__name__}-{i}" for i, (f, _) in enumerate(ON_THE_WIRE)])
def test_each_frame_is_the_header_of_protocol_4_and_decodes_back(frame: ControlFrame, header: Header) -> None:
    assert encode_control(frame) == encode_header(header)
    assert decode_control(header) == frame
    assert _through_the_wire(frame) == frame


def test_every_control_kind_is_covered() -> None:
    covered = {header.kind for _, header in ON_THE_WIRE}
    assert covered == set(Kind) - {Kind.DATA, Kind.REMOTE}


class _Sink:
    def __init__(self) -> None:
        self.control: list[ControlFrame] = []

    def payload_buffer(self, header: Header) -> memoryview:
        raise AssertionError(f"a control frame asked for a payload buffer: {header}")

    def frame_received(self, header: Header, payload: memoryview) -> None:
        assert payload.nbytes == 0
        self.control.append(decode_control(header))


def test_a_stream_of_control_frames_fed_byte_by_byte_decodes_to_the_same_values() -> None:
    frames = [frame for frame, _ in ON_THE_WIRE]
    stream = b"".join(encode_control(frame) for frame in frames)
    sink = _Sink()
    decoder = FrameDecoder(sink)
    for byte in stream:
        decoder.get_buffer()[:1] = bytes((byte,))
        decoder.buffer_updated(1)
    assert sink.control == frames


def test_reasons_are_cut_to_the_limit() -> None:
    reason = "é" * (MAX_REASON_CHARS + 500)  # two bytes each in UTF-8
    abort = _through_the_wire(Abort(3, 1, 2, "OperationTimeoutError", reason))
    assert isinstance(abort, Abort) and abort.reason == "é" * MAX_REASON_CHARS
    expel = _through_the_wire(Expel(3, reason))
    assert isinstance(expel, Expel) and expel.reason == "é" * MAX_REASON_CHARS


INTS = st.integers(0, 2**63 - 1)
TEXT = st.text(max_size=200)


@given(src=INTS, ctx=INTS, instance=INTS, step=INTS, body=TEXT)
def test_any_agreement_step_round_trips(src: int, ctx: int, instance: int, step: int, body: str) -> None:
    frame = Agree(src, ctx, instance, step, body)
    assert _through_the_wire(frame) == frame


@given(src=INTS, ctx=INTS, tag=st.integers(-(2**63), 2**63 - 1), error=TEXT, reason=TEXT, lost=st.none() | INTS)
def test_any_abort_round_trips(src: int, ctx: int, tag: int, error: str, reason: str, lost: int | None) -> None:
    frame = Abort(src, ctx, tag, error, reason, lost)
    assert _through_the_wire(frame) == frame


@given(src=INTS, pid=INTS, fd=INTS, nonce=st.binary(max_size=64), capacity=INTS)
def test_any_ring_offer_round_trips(src: int, pid: int, fd: int, nonce: bytes, capacity: int) -> None:
    frame = RingOffer(src, pid, fd, nonce, capacity)
    assert _through_the_wire(frame) == frame


MALFORMED = {
    "a message": (Header(Kind.DATA, 0, 2, 0, 0, "uint8", (0,), 0), "rank 2 sent a frame of kind 1 where a control frame"),
    "a memory read": (Header(Kind.REMOTE, 0, 2, 0, 0, "uint8", (4,), 4, "", 4096), "kind 5 where a control frame"),
    "a ping with a payload": (Header(Kind.PING, 0, 2, 0, 0, "uint8", (8,), 8), "malformed PING frame: a payload of 8 bytes"),
    "an unknown ring step": (Header(Kind.RING, 0, 2, 0, 4, "uint8", (), 0), "malformed RING frame: unknown step 4"),
    "an offer without a capacity": (Header(Kind.RING, 9, 2, 3, 0, "uint8", (), 0, "00"), "capacity ()"),
    "an offer with a bad nonce": (Header(Kind.RING, 9, 2, 3, 0, "uint8", (64,), 0, "xyz"), "nonce 'xyz'"),
    "a negative agreement instance": (Header(Kind.AGREE, 1, 2, -2, 0, "uint8", (), 0, "{}"), "agreement instance -2"),
    "an abort losing two ranks": (Header(Kind.ABORT, 1, 2, 3, 3, "PeerLostError", (4, 5), 0, "x"), "shape (4, 5)"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_a_malformed_control_header_is_a_protocol_error_naming_the_sender(name: str) -> None:
    header, message = MALFORMED[name]
    with pytest.raises(ProtocolError, match="rank 2 sent") as info:
        decode_control(header)
    assert message in str(info.value)


def test_an_agreement_instance_below_zero_is_refused_before_it_reads_as_an_expulsion() -> None:
    with pytest.raises(ValueError, match="agreement instance -1 is negative"):
        encode_control(Agree(0, 1, -1, 0, "{}"))

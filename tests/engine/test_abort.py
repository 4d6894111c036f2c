"""Tests for asyncdist.engine.abort: an error turned into an Abort frame, through
the wire's encoder and decoder, and back into the error the other ranks raise.

Each kind of error is sent through real frame bytes (``encode_control`` /
``decode_header`` / ``decode_control``); the expected fields and messages are
written out. The last
test runs the round trip between ranks of a local world: one rank's call fails,
the others' receives of that call fail with the relayed error, and nobody
relays a relayed error again.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from asyncdist.buffers.host import as_host_buffer
from asyncdist.engine.abort import abort_frame, error_from_abort, is_relayed
from asyncdist.engine.engine import Engine
from asyncdist.errors import (
    AsyncDistError,
    ClosedError,
    CollectiveMismatchError,
    FrameTooLargeError,
    OperationTimeoutError,
    PeerLostError,
    ProtocolError,
    StoreTimeoutError,
)
from asyncdist.testing import local_world
from asyncdist.wire.control import MAX_REASON_CHARS, Abort, decode_control, encode_control
from asyncdist.wire.frames import PREFIX, Header, Kind, decode_header, encode_header


def _through_the_wire(frame: Abort) -> Abort:
    """The frame as the receiving rank's decoder gives it back."""
    encoded = encode_control(frame)
    (length,) = PREFIX.unpack_from(encoded)
    assert length == len(encoded) - PREFIX.size
    back = decode_control(decode_header(encoded[PREFIX.size :]))
    assert isinstance(back, Abort)
    return back


def _from_header(header: Header) -> Abort:
    """The Abort frame a peer's own header reads as (fields of protocol version 4)."""
    encoded = encode_header(header)
    back = decode_control(decode_header(encoded[PREFIX.size :]))
    assert isinstance(back, Abort)
    return back


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (CollectiveMismatchError("rank 2: all_reduce(sum, float32[4]) disagrees with broadcast"), CollectiveMismatchError),
        (OperationTimeoutError("rank 2: all_gather (call #3 in group 'world') Timed out after 1 s"), OperationTimeoutError),
        # anything else travels as the base class, with its message
        (ProtocolError("bad frame"), AsyncDistError),
        (FrameTooLargeError("frame of 9 bytes"), AsyncDistError),  # a subclass of a kind not carried
        (StoreTimeoutError("store key missing"), AsyncDistError),  # a timeout, but not an operation's
        (ClosedError("rank 2: the process group was destroyed"), AsyncDistError),
        (ValueError("not even ours"), AsyncDistError),
    ],
)
def test_an_error_round_trips_as_its_kind_with_its_message(error: Exception, kind: type) -> None:
    frame = abort_frame(2, 5, 9, error)
    assert frame == Abort(2, 5, 9, frame.error, str(error), None)
    assert frame.error == (type(error).__name__ if kind is not AsyncDistError else "AsyncDistError")

    back = error_from_abort(_through_the_wire(frame))
    assert type(back) is kind
    assert str(back) == f"{error} (relayed by rank 2)"
    assert back.relayed_from == 2
    assert is_relayed(back)


def test_a_lost_peer_round_trips_with_the_rank_that_was_lost() -> None:
    error = PeerLostError("rank 1 lost rank 3: connection reset", 3)
    frame = abort_frame(1, 0, 4, error)
    assert (frame.error, frame.lost, frame.reason) == ("PeerLostError", 3, str(error))

    back = error_from_abort(_through_the_wire(frame))
    assert type(back) is PeerLostError
    assert back.rank == 3  # the rank that was lost, not the one that relayed it
    assert str(back) == "rank 1 lost rank 3: connection reset (relayed by rank 1)"
    assert back.relayed_from == 1


def test_a_lost_peer_without_a_rank_names_the_sender() -> None:
    back = error_from_abort(_from_header(Header(Kind.ABORT, 0, 6, 2, 2, "PeerLostError", (), 0, "gone")))
    assert type(back) is PeerLostError and back.rank == 6
    assert str(back) == "gone (relayed by rank 6)"


def test_an_unknown_kind_from_a_peer_becomes_the_base_class() -> None:
    back = error_from_abort(_from_header(Header(Kind.ABORT, 0, 1, 2, 2, "SystemExit", (), 0, "why")))
    assert type(back) is AsyncDistError and str(back) == "why (relayed by rank 1)"


def test_rank_zero_relays_count_as_relayed() -> None:
    back = error_from_abort(_through_the_wire(abort_frame(0, 0, 1, CollectiveMismatchError("x"))))
    assert back.relayed_from == 0
    assert is_relayed(back)  # 0 is a rank, not "no rank"


def test_errors_raised_here_are_not_relayed() -> None:
    assert not is_relayed(CollectiveMismatchError("mine"))
    assert not is_relayed(PeerLostError("mine", 1))
    assert not is_relayed(ValueError("mine"))


def test_a_long_reason_is_cut_and_a_negative_tag_keeps_the_sequence_valid() -> None:
    reason = "é" * (MAX_REASON_CHARS + 500)  # two bytes each in UTF-8
    frame = abort_frame(3, 1, -4, OperationTimeoutError(reason))
    header = frame.header()
    assert header.op == "é" * MAX_REASON_CHARS
    assert (header.tag, header.seq) == (-4, 0)  # seq may not be negative on the wire
    back = error_from_abort(_through_the_wire(frame))
    assert str(back) == "é" * MAX_REASON_CHARS + " (relayed by rank 3)"


async def test_a_failed_call_fails_the_other_ranks_receives_and_is_relayed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    aborts: list[tuple[int, list[int], str]] = []
    original = Engine.send_abort

    def recording(self: Engine, ranks, ctx: int, tag: int, error: BaseException) -> None:
        ranks = list(ranks)
        aborts.append((self.rank, ranks, type(error).__name__))
        original(self, ranks, ctx, tag, error)

    monkeypatch.setattr(Engine, "send_abort", recording)

    async with local_world(3) as ranks:

        async def failing(g) -> None:
            channel = g.channel("all_reduce(sum, int64[2])")

            async def algorithm() -> None:
                raise CollectiveMismatchError("rank 0: the ranks disagree")

            await channel.run(algorithm())

        async def waiting(g) -> None:
            channel = g.channel("all_reduce(sum, int64[2])")
            await channel.run(channel.recv(as_host_buffer(np.zeros(2, np.int64), writable=True), 0))

        results = await asyncio.gather(failing(ranks[0]), waiting(ranks[1]), waiting(ranks[2]), return_exceptions=True)

        assert type(results[0]) is CollectiveMismatchError and str(results[0]) == "rank 0: the ranks disagree"
        assert not is_relayed(results[0])
        for rank in (1, 2):
            error = results[rank]
            assert type(error) is CollectiveMismatchError
            assert str(error) == "rank 0: the ranks disagree (relayed by rank 0)"
            assert error.relayed_from == 0
        # only the rank where the call failed told the others
        assert aborts == [(0, [1, 2], "CollectiveMismatchError")]

        # the failed call leaves the group usable: the next call works on every rank
        data = [np.array([r, 1], np.int64) for r in range(3)]
        await asyncio.gather(*(g.all_reduce(x) for g, x in zip(ranks, data)))
        for x in data:
            assert x.tolist() == [0 + 1 + 2, 3]

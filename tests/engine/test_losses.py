"""Which lost peer dooms which receive: the rules of asyncdist.engine.losses, case by case."""

from __future__ import annotations

import pytest

from asyncdist.buffers.host import HostBuffer
from asyncdist.errors import PeerLostError
from asyncdist.engine.losses import Losses
from asyncdist.engine.matching import PostedRecv


def receive(src: int | None, sources=(), op: str | None = None) -> PostedRecv:
    return PostedRecv(0, src, 0, HostBuffer(memoryview(bytearray(0)), "uint8", (0,)), None, frozenset(sources), op)


def lose(losses: Losses, rank: int, *, orderly: bool) -> PeerLostError:
    error = PeerLostError(f"rank {rank} {'left' if orderly else 'crashed'}", rank)
    assert losses.record(rank, error, orderly=orderly)
    return error


@pytest.mark.parametrize("orderly", [False, True])
def test_a_named_sender_that_is_gone_dooms_the_receive(orderly: bool) -> None:
    losses = Losses()
    error = lose(losses, 1, orderly=orderly)
    assert losses.fatal_for(receive(1)) is error
    assert losses.fatal_for(receive(2)) is None
    assert 1 in losses and losses.error(1) is error and losses.error(2) is None


def test_a_loss_is_recorded_once() -> None:
    losses = Losses()
    first = lose(losses, 1, orderly=True)
    assert not losses.record(1, PeerLostError("again", 1), orderly=False)
    assert losses.error(1) is first
    assert losses.fatal_for(receive(None, {1, 2})) is None  # still counted as a goodbye


def test_any_source_fails_on_a_crash_or_when_every_candidate_is_gone() -> None:
    losses = Losses()
    lose(losses, 1, orderly=True)
    assert losses.fatal_for(receive(None, {1, 2})) is None  # rank 2 may still send
    crash = lose(losses, 3, orderly=False)
    assert losses.fatal_for(receive(None, {2, 3})) is crash  # 3 may have been the sender
    last = lose(losses, 2, orderly=True)
    assert losses.fatal_for(receive(None, {1, 2})) is last  # nobody is left to send


def test_a_collective_fails_on_a_crashed_member_but_not_on_one_that_left() -> None:
    losses = Losses()
    lose(losses, 2, orderly=True)
    assert losses.fatal_for(receive(1, {1, 2, 3}, op="all_reduce(sum, float32[4])")) is None
    crash = lose(losses, 3, orderly=False)
    assert losses.fatal_for(receive(1, {1, 2, 3}, op="all_reduce(sum, float32[4])")) is crash
    assert losses.fatal_for(receive(1, {1, 2, 3})) is None  # a p2p receive names its sender only


class _Untouchable(frozenset):
    """Sources that fail the test if anything looks through them."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        raise AssertionError("a receive's sources were scanned although no peer was lost")


def test_with_no_loss_a_receive_costs_no_scan_of_its_sources() -> None:
    # Every receive of a collective names all other members as sources: at
    # n = 64 a scan made each message cost 63 lookups.
    sources = _Untouchable(range(1, 64))
    recv = PostedRecv(0, 1, 0, HostBuffer(memoryview(bytearray(0)), "uint8", (0,)), None, sources, "all_reduce")
    assert Losses().fatal_for(recv) is None

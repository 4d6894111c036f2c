"""Large payloads between ranks on one host go by memory (cross-memory attach).

Each test names the path it expects, and checks it was taken: the REMOTE
frames a connection sent, counted by wrapping ``ByMemory.send``.
The inline path (``ASYNCDIST_CMA=0``) must give the same results.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from asyncdist.reduce import kernels as ops
from asyncdist.buffers.host import as_host_buffer
from asyncdist.errors import BufferMismatchError, PeerLostError, ProtocolError
from asyncdist.reduce.kernels import ReduceOp
from asyncdist.testing import local_world, spawn
from asyncdist.transport import cma
from asyncdist.transport.by_memory import ByMemory
from asyncdist.transport.stream import Connection
from asyncdist.wire.frames import FrameDecoder, Header, Kind, encode_header

pytestmark = pytest.mark.skipif(cma.local_token() is None, reason="cross-memory attach unavailable here")

BIG = 1 << 20  # float32 elements: 4 MiB, far above the 512 KiB threshold


@pytest.fixture
def remote_sends(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The payload sizes sent by memory during the test."""
    sizes: list[int] = []
    original = ByMemory.send

    def counting(self: ByMemory, loop: asyncio.AbstractEventLoop, header: Header, payload: memoryview) -> asyncio.Future:
        sizes.append(payload.nbytes)
        return original(self, loop, header, payload)

    monkeypatch.setattr(ByMemory, "send", counting)
    return sizes


@pytest.mark.parametrize("by_memory", [True, False], ids=["by-memory", "inline"])
async def test_a_large_exchange_arrives_bit_exact_on_either_path(
    by_memory: bool, remote_sends: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ASYNCDIST_CMA", "1" if by_memory else "0")
    data = [np.random.default_rng(r).standard_normal(BIG).astype(np.float32) for r in range(2)]
    async with local_world(2) as ranks:
        got = [np.empty(BIG, np.float32) for _ in range(2)]
        await asyncio.gather(*(g.send(data[g.rank], 1 - g.rank) for g in ranks), *(g.recv(got[g.rank], 1 - g.rank) for g in ranks))
        small = np.arange(10, dtype=np.int64)  # below the threshold: always inline
        await asyncio.gather(ranks[0].send(small, 1), ranks[1].recv(got_small := np.empty(10, np.int64), 0))
    assert got[0].tobytes() == data[1].tobytes() and got[1].tobytes() == data[0].tobytes()
    np.testing.assert_array_equal(got_small, small)
    assert remote_sends == ([BIG * 4, BIG * 4] if by_memory else [])


async def test_a_payload_that_arrives_before_its_receive_is_kept(remote_sends: list[int]) -> None:
    data = np.random.default_rng(1).integers(0, 1 << 30, BIG, dtype=np.int64)
    async with local_world(2) as ranks:
        await ranks[0].send(data, 1, tag=5)  # completes: the receiver copied it out unasked
        data_copy = data.copy()
        data[:] = -1  # the sender may reuse its buffer now
        got = np.empty_like(data)
        await ranks[1].recv(got, 0, tag=5)
    np.testing.assert_array_equal(got, data_copy)
    assert remote_sends == [BIG * 8]


async def test_a_mismatched_receive_fails_and_the_send_still_completes(remote_sends: list[int]) -> None:
    async with local_world(2) as ranks:
        send = ranks[0].isend(np.ones(BIG, np.float32), 1)
        with pytest.raises(BufferMismatchError, match=r"rank 0 sent float32\[1048576\]"):
            await ranks[1].recv(np.empty(BIG, np.float64), 0)
        await send  # answered with DONE although the payload was refused
        # The pair still works afterwards.
        got = np.empty(BIG, np.float32)
        await asyncio.gather(ranks[0].send(np.full(BIG, 3, np.float32), 1), ranks[1].recv(got, 0))
    np.testing.assert_array_equal(got, 3)
    assert remote_sends == [BIG * 4, BIG * 4]


async def test_closing_waits_until_the_peer_has_read_the_payload(remote_sends: list[int]) -> None:
    data = np.random.default_rng(2).standard_normal(BIG)
    async with local_world(2) as ranks:
        ranks[0].isend(data, 1)
        await ranks[0].close()  # drains: returns only once rank 1 has copied the payload
        got = np.empty_like(data)
        await ranks[1].recv(got, 0)
    np.testing.assert_array_equal(got, data)
    assert remote_sends == [BIG * 8]


@pytest.mark.parametrize(("code", "match"), [
    # A sender that exits between its REMOTE header and the read: it died, nothing more.
    (errno.ESRCH, r"rank 0's process ended while its payload was read from its memory"),
    # Memory it does not have: it broke the protocol.
    (errno.EFAULT, r"rank 0 broke the wire protocol: cannot read rank 0's payload from its memory: \[Errno 14\]"),
], ids=["sender-died", "bad-address"])
async def test_a_payload_that_cannot_be_read_loses_the_peer_on_both_sides(
    code: int, match: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    def unreadable(self: cma.PeerMemory, dest: memoryview, addr: int) -> None:
        raise OSError(code, os.strerror(code))

    async with local_world(2) as ranks:
        monkeypatch.setattr(cma.PeerMemory, "read_into", unreadable)
        sending = ranks[0].isend(np.ones(BIG, np.float32), 1)
        with pytest.raises(PeerLostError, match=match) as info:
            await ranks[1].recv(np.empty(BIG, np.float32), 0)
        assert info.value.rank == 0
        with pytest.raises(PeerLostError, match="rank 1"):
            await sending


def test_reading_an_ended_process_says_that_it_ended() -> None:
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()  # reaped: its pid names no process now
    with pytest.raises(PeerLostError, match="rank 3's process ended while its payload was read") as info:
        cma.read_payload(cma.PeerMemory(ended.pid), 3, memoryview(bytearray(8)), 4096)
    assert info.value.rank == 3 and isinstance(info.value.__cause__, ProcessLookupError)


@pytest.mark.parametrize("path", ["by-memory", "inline", "arrived-first"])
async def test_a_folding_receive_adds_the_message_into_its_buffer(
    path: str, remote_sends: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ASYNCDIST_CMA", "0" if path == "inline" else "1")
    monkeypatch.setattr(cma, "FOLD_PIECE_BYTES", 96 << 10)  # 43 pieces, the last one short
    count = BIG + 3
    data = np.random.default_rng(3).integers(-1000, 1000, count).astype(np.float32)
    acc = np.random.default_rng(4).integers(-1000, 1000, count).astype(np.float32)
    expected = acc + data
    pieces: list[tuple[int, int]] = []
    async with local_world(2) as ranks:
        buf = as_host_buffer(acc, writable=True)
        add = ops.folder(ReduceOp.SUM, buf)

        def fold(piece: np.ndarray, offset: int) -> None:
            pieces.append((offset, piece.nbytes))
            add(piece, offset)

        if path == "arrived-first":  # read whole into a buffer of the engine's, folded when posted
            await ranks[0].send(data, 1, tag=9)
        receiver = ranks[1]
        recv = receiver.engine.post_recv(receiver.calls.p2p_context, 0, 9, buf, fold=fold)
        if path != "arrived-first":
            await ranks[0].send(data, 1, tag=9)
        header = await recv.future
    np.testing.assert_array_equal(acc, expected)
    assert header.nbytes == count * 4
    if path == "by-memory":
        step = 96 << 10
        assert pieces == [(offset, min(step, count * 4 - offset)) for offset in range(0, count * 4, step)]
    else:
        assert pieces == [(0, count * 4)]
    assert remote_sends == ([] if path == "inline" else [count * 4])


# -- the connection's side of the protocol, against a raw socket --------------


class _Sink:
    """Hands DONE frames to the connection, as the engine does."""

    connection: Connection

    def payload_buffer(self, header: Header) -> memoryview:
        return memoryview(bytearray(header.nbytes))

    def frame_received(self, header: Header, payload: memoryview) -> None:
        if header.kind == Kind.DONE:
            self.connection.by_memory.done()


async def _connection_to_a_raw_socket() -> tuple[Connection, socket.socket, asyncio.Future]:
    ours, theirs = socket.socketpair()
    lost = asyncio.get_running_loop().create_future()
    sink = _Sink()
    sink.connection = Connection(asyncio.get_running_loop(), ours, 1, FrameDecoder(sink), lost.set_result, peer_reads_me=True)
    return sink.connection, theirs, lost


async def test_a_send_by_memory_completes_on_done_and_fails_if_the_peer_goes_away() -> None:
    connection, theirs, lost = await _connection_to_a_raw_socket()
    header = Header(Kind.DATA, 0, 0, 0, 0, "uint8", (4,), 4, "")
    loop = asyncio.get_running_loop()
    answered = connection.by_memory.send(loop, header, memoryview(b"abcd"))
    unanswered = connection.by_memory.send(loop, header, memoryview(b"efgh"))
    theirs.sendall(encode_header(Header(Kind.DONE, 0, 1, 0, 0, "uint8", (), 0)))
    await answered  # the oldest one
    assert not unanswered.done()
    theirs.close()  # the peer dies without answering the second
    with pytest.raises(PeerLostError, match="rank 1"):
        await unanswered
    assert isinstance(await lost, PeerLostError)


async def test_a_done_for_nothing_breaks_the_protocol() -> None:
    _, theirs, lost = await _connection_to_a_raw_socket()
    theirs.sendall(encode_header(Header(Kind.DONE, 0, 1, 0, 0, "uint8", (), 0)))
    error = await lost
    assert isinstance(error, PeerLostError) and isinstance(error.__cause__, ProtocolError)
    assert "acknowledged a payload that was never sent by memory" in str(error)
    theirs.close()


def _exchange_between_processes(size: int) -> tuple[str, list[int]]:
    """Both ranks send a large array to each other at once; return a digest
    of what arrived and the sizes this rank sent by memory."""
    import hashlib

    import asyncdist as dist

    sent_by_memory: list[int] = []
    original = ByMemory.send

    def counting(self: ByMemory, loop: asyncio.AbstractEventLoop, header: Header, payload: memoryview) -> asyncio.Future:
        sent_by_memory.append(payload.nbytes)
        return original(self, loop, header, payload)

    ByMemory.send = counting  # this rank's process only
    dist.init_process_group()
    rank = dist.get_rank()
    mine = np.random.default_rng(rank).standard_normal(size).astype(np.float32)
    theirs = np.empty(size, np.float32)
    work = dist.isend(mine, 1 - rank)
    dist.recv(theirs, 1 - rank)
    work.wait()
    dist.destroy_process_group()
    return hashlib.sha256(theirs.tobytes()).hexdigest(), sent_by_memory


def test_processes_read_each_others_payloads() -> None:
    size = 4 << 20
    results = spawn(2, _exchange_between_processes, size)
    for rank, (digest, sent_by_memory) in enumerate(results):
        expected = np.random.default_rng(1 - rank).standard_normal(size).astype(np.float32)
        assert digest == hashlib.sha256(expected.tobytes()).hexdigest()
        assert sent_by_memory == [size * 4]

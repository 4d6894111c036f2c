"""Strangers and bad bytes against a live rank: refused, logged, and the job carries on.

Two kinds of intruder:

* a stranger on a rank's port, who fails the handshake (no or wrong secret,
  wrong version or job, noise, an oversized or truncated message, a message
  longer than announced): the connection is refused and logged, and the
  world's ranks go on talking;
* a rank of the job (it has the secret) that breaks the wire protocol after
  the handshake: that one peer is dropped, logged, and the others go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import random
import socket
import uuid
from pathlib import Path
from typing import AsyncIterator

import msgpack
import numpy as np
import pytest

from asyncdist.engine import mailbox
from asyncdist.engine.engine import Engine
from asyncdist.errors import PeerLostError
from asyncdist.wire.handshake import MAGIC, PROTOCOL_VERSION, Identity, encode_message
from asyncdist.group.process_group import ProcessGroup
from asyncdist.testing import local_world
from asyncdist.transport import cma
from asyncdist.transport.connect import dial
from asyncdist.transport.heartbeat import HeartbeatConfig
from asyncdist.wire.frames import MAX_HEADER_BYTES, PREFIX, Header, Kind, encode_header

# -- strangers: the handshake -------------------------------------------------------


def _hello(job: str, *, version: int = PROTOCOL_VERSION, magic: str = MAGIC, rank: int = 1) -> bytes:
    return encode_message({"type": "HELLO", "magic": magic, "version": version, "job": job, "rank": rank, "to": 0,
                           "nonce": os.urandom(16)})


def _longer_than_announced(job: str) -> bytes:
    hello = _hello(job)
    return PREFIX.pack(len(hello) - PREFIX.size - 10) + hello[PREFIX.size:] + b"\x00" * 64


def _talk(address: tuple[str, int], first: bytes, auth_mac: bytes | None = None, close: bool = True) -> bytes:
    """Connect, send ``first``; with ``auth_mac``, answer the challenge with it.
    Return everything the rank sent back before it closed the connection."""
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(first)
        reply = b""
        if auth_mac is not None:
            reply = _recv_exact(sock, PREFIX.size)
            reply += _recv_exact(sock, PREFIX.unpack(reply)[0])
            assert msgpack.unpackb(reply[PREFIX.size:])["type"] == "CHALLENGE"
            sock.sendall(encode_message({"type": "AUTH", "mac": auth_mac, "memory": None}))
        if close:
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:  # the rank refused before we finished: nothing left to read
                return reply
        try:
            while chunk := sock.recv(4096):
                reply += chunk
        except ConnectionResetError:  # closed with our bytes unread: also a refusal
            pass
        return reply


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "closed"
        data += chunk
    return data


# name -> (what the stranger sends, given the job id; the reason the rank logs)
STRANGERS = {
    "random-bytes": (lambda job: random.Random(1).randbytes(200), "refused a connection"),
    "http-request": (lambda job: b"GET / HTTP/1.1\r\nHost: rank\r\n\r\n", "exceeds the limit of 4096 bytes"),
    "oversized-header": (lambda job: PREFIX.pack(1 << 31) + b"x" * 16, "exceeds the limit of 4096 bytes"),
    "truncated-header": (lambda job: b"\x00\x00", "failed during the handshake"),
    "truncated-message": (lambda job: PREFIX.pack(100) + b"\x85" * 10, "failed during the handshake"),
    "longer-than-announced": (_longer_than_announced, "malformed handshake message"),
    "wrong-version": (lambda job: _hello(job, version=PROTOCOL_VERSION + 98), "protocol version mismatch"),
    "wrong-magic": (lambda job: _hello(job, magic="torch"), "bad magic"),
    "wrong-job": (lambda job: _hello("another-job"), "job id mismatch"),
}


@contextlib.asynccontextmanager
async def _watched_world(caplog) -> AsyncIterator[list[ProcessGroup]]:
    with caplog.at_level(logging.WARNING):
        async with local_world(2) as ranks:
            yield ranks
            # The job carries on: point to point and a collective.
            got = np.zeros(2)
            await asyncio.gather(ranks[1].send(np.array([1.0, 2.0]), 0), ranks[0].recv(got, 1))
            assert got.tolist() == [1.0, 2.0]
            x = [np.full(1, g.rank + 1.0) for g in ranks]
            await asyncio.gather(*(g.all_reduce(v) for g, v in zip(ranks, x)))
            assert x[0][0] == x[1][0] == 3.0


def _logged(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


@pytest.mark.parametrize("name", sorted(STRANGERS))
async def test_a_stranger_is_refused_and_logged(name: str, caplog) -> None:
    make, reason = STRANGERS[name]
    async with _watched_world(caplog) as (a, _):
        reply = await asyncio.to_thread(_talk, a.engine.address, make(a.engine.me.job_id))
        assert reply == b"" or b"REJECT" in reply
        lines = _logged(caplog, reason)
        assert lines and "rank 0" in lines[0] and "127.0.0.1" in lines[0], [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("claim", [1, 7], ids=["a-rank-of-the-job", "no-rank-of-the-job"])
@pytest.mark.parametrize("mac", [b"", b"\x00" * 32], ids=["no-secret", "wrong-secret"])
async def test_a_stranger_without_the_secret_is_refused_and_logged(mac: bytes, claim: int, caplog) -> None:
    # Whatever rank it claims, it is answered alike: which claims pass would tell it the world size.
    async with _watched_world(caplog) as (a, _):
        hello = _hello(a.engine.me.job_id, rank=claim)  # it knows the job id
        reply = await asyncio.to_thread(_talk, a.engine.address, hello, mac)
        assert b"REJECT" in reply and b"failed authentication" in reply
        assert _logged(caplog, "failed authentication (wrong job secret)")
        # It learnt nothing of the rank's process: no pid, no memory probe
        # (address or bytes), no job id, no rank or world size; only a nonce and a MAC.
        challenge = msgpack.unpackb(reply[PREFIX.size:PREFIX.size + PREFIX.unpack(reply[:PREFIX.size])[0]])
        assert set(challenge) == {"type", "magic", "version", "nonce", "mac"}
        token = cma.local_token()  # the ranks of local_world share this process's probe
        for secret_of_the_rank in (a.engine.me.job_id.encode(), *((token["probe"],) if token else ())):
            assert secret_of_the_rank not in reply
        rest = msgpack.Unpacker(raw=False)
        rest.feed(reply[PREFIX.size * 2 + len(msgpack.packb(challenge)):])
        assert [m for m in rest] == [{"type": "REJECT", "reason": f"a peer claiming rank {claim} failed "
                                                                 "authentication (wrong job secret)"}]


async def test_a_stranger_is_not_told_the_job_id(caplog) -> None:
    async with _watched_world(caplog) as (a, _):
        job = a.engine.me.job_id.encode()
        for first in (_hello("another-job"), _hello("another-job", rank=7), b"GET / HTTP/1.1\r\n\r\n"):
            reply = await asyncio.to_thread(_talk, a.engine.address, first)
            assert job not in reply, reply
        assert _logged(caplog, "job id mismatch")


async def test_a_stranger_that_never_finishes_the_handshake_is_dropped(caplog) -> None:
    async with _watched_world(caplog) as (a, _):
        a.engine._mesh.handshake_timeout = 0.3
        reply = await asyncio.to_thread(_talk, a.engine.address, b"\x00\x00", None, False)  # then silence
        assert reply == b""
        assert _logged(caplog, "did not finish the handshake in time")


async def test_a_second_connection_from_a_connected_rank_is_refused(caplog) -> None:
    async with _watched_world(caplog) as (a, b):
        loop = asyncio.get_running_loop()
        sock, _ = await dial(loop, *a.engine.address, b.engine.me, 0)  # it has the secret
        try:
            assert await loop.sock_recv(sock, 1) == b""  # accepted by the handshake, then closed
        finally:
            sock.close()
        assert _logged(caplog, "refused an unexpected second connection from rank 1")


async def test_objects_from_a_stranger_are_never_unpickled(tmp_path: Path, caplog) -> None:
    marker = tmp_path / "unpickled"

    class Bomb:
        def __reduce__(self):
            return (Path.touch, (marker,))

    bomb = pickle.dumps(Bomb())
    async with _watched_world(caplog) as (a, b):
        job = a.engine.me.job_id
        # As a frame, and as the payload of a would-be handshake.
        frame = encode_header(Header(Kind.DATA, 0, 1, 1, 1, "uint8", (len(bomb),), len(bomb), "x")) + bomb
        for junk in (frame, PREFIX.pack(len(bomb)) + bomb, _hello(job) + frame):
            await asyncio.to_thread(_talk, a.engine.address, junk)
        objects = [None, None]
        await asyncio.gather(a.all_gather_object(objects, {"from": 0}), b.all_gather_object([None, None], {"from": 1}))
        assert objects == [{"from": 0}, {"from": 1}]
    assert not marker.exists()


# -- a rank of the job that breaks the protocol after the handshake -------------------


@contextlib.asynccontextmanager
async def _two_ranks_and_an_insider() -> AsyncIterator[tuple[list[ProcessGroup], list[socket.socket]]]:
    """Ranks 0 and 1 of a 3-rank job; the test holds rank 2's authenticated sockets."""
    job, secret = uuid.uuid4().hex, os.urandom(32)
    off = HeartbeatConfig(0, 0)
    engines = [Engine(Identity(job, r, 3, secret), heartbeat=off) for r in range(2)]
    loop = asyncio.get_running_loop()
    socks: list[socket.socket] = []
    try:
        addresses = [await e.listen("127.0.0.1") for e in engines]
        joined = asyncio.gather(engines[0].connect({}, 10), engines[1].connect({0: addresses[0]}, 10))
        insider = Identity(job, 2, 3, secret)
        socks = [(await dial(loop, *addresses[r], insider, r))[0] for r in range(2)]
        await joined
        yield [ProcessGroup(e, range(3), name="world", timeout=10) for e in engines], socks
    finally:
        for sock in socks:
            sock.close()
        await asyncio.gather(*(e.close() for e in engines))


def _data(nbytes: int, *, kind: int = Kind.DATA, src: int = 2) -> bytes:
    return encode_header(Header(kind, 0, src, 0, 0, "uint8", (nbytes,), nbytes, ""))


BROKEN_FRAMES = {
    "payload-longer-than-announced": (_data(8) + b"\xff" * 108, "exceeds the limit"),
    "oversized-header": (PREFIX.pack(MAX_HEADER_BYTES + 1) + b"\x00" * 8, "exceeds the limit"),
    "malformed-header": (PREFIX.pack(6) + b"\xc1" * 6, "malformed frame header"),
    "truncated-header": (_data(8)[:7], "rank 2 closed the connection"),
    "truncated-payload": (_data(1000) + b"\x00" * 10, "rank 2 closed the connection"),
    "ping-with-payload": (_data(8, kind=Kind.PING) + b"\x00" * 8, "frame of kind 4 with a payload"),
    "claims-another-source": (_data(0, src=1), "claiming to come from rank 1"),
    # 5.5e11 bytes, unexpected (no receive waits for it): more than any test host's memory.
    "payload-larger-than-memory": (_data(550_000_000_000), "rank 2 announced a payload of 550000000000 bytes, "
                                                           "more than this host's memory"),
}


@pytest.mark.parametrize("name", sorted(BROKEN_FRAMES))
async def test_a_rank_that_breaks_the_wire_protocol_is_dropped_alone(name: str, caplog) -> None:
    junk, reason = BROKEN_FRAMES[name]
    with caplog.at_level(logging.WARNING):
        async with _two_ranks_and_an_insider() as ((zero, one), (to_zero, _)):
            waiting = zero.irecv(np.zeros(1), 2, tag=99)  # depends on rank 2; matches none of its frames
            loop = asyncio.get_running_loop()
            await loop.sock_sendall(to_zero, junk)
            with contextlib.suppress(OSError):  # rank 0 may have dropped us already
                to_zero.shutdown(socket.SHUT_WR)
            with pytest.raises(PeerLostError, match=reason) as info:
                await asyncio.wait_for(waiting, 10)
            assert info.value.rank == 2
            assert _logged(caplog, "rank 0 lost rank 2")
            assert not [r for r in caplog.records if r.exc_info], "one line each, no traceback"
            # Ranks 0 and 1 carry on, point to point and in a group without rank 2.
            got = np.zeros(3)
            await asyncio.gather(one.send(np.arange(3.0), 0), zero.recv(got, 1))
            assert got.tolist() == [0.0, 1.0, 2.0]
            pairs = [g.new_group([0, 1]) for g in (zero, one)]
            x, y = np.ones(2), np.full(2, 2.0)
            await asyncio.gather(pairs[0].all_reduce(x), pairs[1].all_reduce(y))
            assert x.tolist() == y.tolist() == [3.0, 3.0]


async def test_a_payload_the_process_cannot_allocate_is_refused_in_one_line(caplog, monkeypatch) -> None:
    # Below the host's memory, but the allocation fails (other processes hold the rest).
    def no_memory(nbytes: int) -> np.ndarray:
        raise MemoryError((nbytes,), np.dtype(np.uint8))

    monkeypatch.setattr(mailbox.pool, "take_bytes", no_memory)
    with caplog.at_level(logging.WARNING):
        async with _two_ranks_and_an_insider() as ((zero, _), (to_zero, _)):
            waiting = zero.irecv(np.zeros(1), 2, tag=99)
            await asyncio.get_running_loop().sock_sendall(to_zero, _data(1 << 30) + b"\x00" * 64)
            with pytest.raises(PeerLostError, match="rank 2 announced a payload of 1073741824 bytes, and this "
                                                    "process cannot allocate it") as info:
                await asyncio.wait_for(waiting, 10)
            assert info.value.rank == 2
    assert not [r for r in caplog.records if r.exc_info]

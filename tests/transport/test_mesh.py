"""Tests for asyncdist.transport.mesh: ranks in one loop listen, dial and accept
over real loopback sockets and authenticate with the job's secret.

Each test rank is a :class:`Mesh` with an ``attach`` that records the
authenticated sockets; the test then checks every pair holds the two ends of
one TCP stream (addresses, and bytes sent one way arriving the other). Waits
are on events set by ``attach`` or on a socket's end of file, never on sleeps.
The rendezvous timeout that names the ranks that never connected belongs to
the Engine that drives the mesh (:meth:`Engine.connect`); it is tested here too.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid

import pytest

from asyncdist.engine.engine import Engine
from asyncdist.errors import HandshakeError, PeerLostError, RendezvousError
from asyncdist.transport.mesh import Mesh
from asyncdist.wire.frames import PREFIX
from asyncdist.wire.handshake import (
    Dialer,
    Identity,
    PeerAccess,
    decode_message,
    encode_message,
)

SECRET = b"the job's secret"
WAIT = 10.0  # seconds; only a broken mesh ever waits this long
# The rendezvous timeout of the tests that let it pass: long enough for the
# ranks that do connect to finish on a loaded 2-core machine (0.3 s was not).
RENDEZVOUS = 1.0


class TestRank:
    """One rank's Mesh and the streams it attached, by peer."""

    __test__ = False

    def __init__(self, job: str, rank: int, n: int, secret: bytes = SECRET, handshake_timeout: float = 5.0) -> None:
        self.rank, self.n = rank, n
        self.attached: dict[int, tuple[socket.socket, PeerAccess]] = {}
        self.connected = asyncio.Event()
        self.mesh = Mesh(
            Identity(job, rank, n, secret),
            handshake_timeout=handshake_timeout,
            attach=self._attach,
            wanted=lambda peer: peer not in self.attached,
        )

    def _attach(self, peer: int, sock: socket.socket, access: PeerAccess) -> None:
        assert peer not in self.attached, f"rank {self.rank} attached rank {peer} twice"
        self.attached[peer] = (sock, access)
        if len(self.attached) == self.n - 1:
            self.connected.set()

    def sock(self, peer: int) -> socket.socket:
        return self.attached[peer][0]

    async def close(self) -> None:
        await self.mesh.close()
        for sock, _ in self.attached.values():
            sock.close()


@pytest.fixture
async def job():
    """``start(n, ranks=...)``: listening TestRanks of one job; all closed after the test."""
    job_id = uuid.uuid4().hex
    made: list[TestRank] = []

    async def start(n: int, ranks=None, **kw) -> tuple[list[TestRank], list[tuple[str, int]]]:
        ranks_ = [TestRank(job_id, r, n, **kw) for r in (range(n) if ranks is None else ranks)]
        made.extend(ranks_)
        addresses = [await r.mesh.listen("127.0.0.1") for r in ranks_]
        return ranks_, addresses

    start.job_id = job_id
    yield start
    for r in made:
        await r.close()


async def _read_exactly(sock: socket.socket, n: int) -> bytes:
    loop = asyncio.get_running_loop()
    data = b""
    while len(data) < n:
        chunk = await asyncio.wait_for(loop.sock_recv(sock, n - len(data)), WAIT)
        assert chunk, f"end of stream after {data!r}"
        data += chunk
    return data


async def _closed_by_peer(sock: socket.socket) -> bool:
    """True once the other end has closed ``sock`` (end of file, or a reset)."""
    try:
        return await asyncio.wait_for(asyncio.get_running_loop().sock_recv(sock, 1), WAIT) == b""
    except ConnectionResetError:
        return True


@pytest.mark.parametrize("n", [3, 4])
async def test_every_rank_connects_to_every_other_over_one_stream_per_pair(job, n: int) -> None:
    ranks, addresses = await job(n)
    for host, port in addresses:
        assert host == "127.0.0.1" and port > 0
    assert len({port for _, port in addresses}) == n

    # the higher rank of each pair dials the lower one
    await asyncio.wait_for(
        asyncio.gather(*(ranks[r].mesh.dial(p, *addresses[p]) for r in range(n) for p in range(r))), WAIT
    )
    await asyncio.wait_for(asyncio.gather(*(r.connected.wait() for r in ranks)), WAIT)

    loop = asyncio.get_running_loop()
    for r in range(n):
        assert sorted(ranks[r].attached) == [p for p in range(n) if p != r]
        for p in range(r):
            mine, theirs = ranks[r].sock(p), ranks[p].sock(r)
            # the two ends of one TCP connection, the dialer's port ephemeral
            assert mine.getpeername() == theirs.getsockname() == addresses[p]
            assert theirs.getpeername() == mine.getsockname()
            # both learned the same about reading each other's memory
            mine_access, their_access = ranks[r].attached[p][1], ranks[p].attached[r][1]
            assert (mine_access.peer_memory is not None) == their_access.peer_reads_me
            assert (their_access.peer_memory is not None) == mine_access.peer_reads_me
    # bytes go both ways on every stream, and arrive at the right rank
    for r in range(n):
        for p in ranks[r].attached:
            await loop.sock_sendall(ranks[r].sock(p), f"{r}->{p};".encode())
    for p in range(n):
        for r in ranks[p].attached:
            expected = f"{r}->{p};".encode()
            assert await _read_exactly(ranks[p].sock(r), len(expected)) == expected


async def test_a_rank_with_the_wrong_secret_is_refused_and_the_right_one_still_gets_in(job) -> None:
    (rank0, rank1), addresses = await job(2)
    impostor = TestRank(job.job_id, 1, 2, secret=b"another job's secret")
    try:
        with pytest.raises(HandshakeError) as caught:
            await asyncio.wait_for(impostor.mesh.dial(0, *addresses[0]), WAIT)
        assert str(caught.value) == "rank 0 failed authentication (different job secret, or not rank 0 of this job?)"
        assert impostor.attached == {}
    finally:
        await impostor.close()

    await asyncio.wait_for(rank1.mesh.dial(0, *addresses[0]), WAIT)
    await asyncio.wait_for(rank0.connected.wait(), WAIT)
    assert list(rank0.attached) == [1]
    assert rank0.sock(1).getpeername() == rank1.sock(0).getsockname()


async def test_the_acceptor_refuses_a_wrong_secret_and_says_why(job, caplog) -> None:
    # A dialer that does not check the acceptor, and answers with a MAC made
    # without the secret: the acceptor must refuse it, log it and say why.
    caplog.set_level(logging.WARNING, logger="asyncdist.transport")
    (rank0,), addresses = await job(3, ranks=[0])
    loop = asyncio.get_running_loop()
    sock = socket.create_connection(addresses[0])
    sock.setblocking(False)
    host, port = sock.getsockname()
    here = f"{host}:{port}"
    try:
        await loop.sock_sendall(sock, Dialer(Identity(job.job_id, 2, 3, b"guess"), 0).hello())
        (length,) = PREFIX.unpack(await _read_exactly(sock, PREFIX.size))
        challenge = decode_message(await _read_exactly(sock, length), "CHALLENGE")
        assert set(challenge) == {"type", "magic", "version", "nonce", "mac"}  # nothing of the job or rank 0
        await loop.sock_sendall(sock, encode_message({"type": "AUTH", "mac": b"\0" * 32, "memory": None}))
        (length,) = PREFIX.unpack(await _read_exactly(sock, PREFIX.size))
        with pytest.raises(HandshakeError) as caught:
            decode_message(await _read_exactly(sock, length), "WELCOME")
        assert "a peer claiming rank 2 failed authentication (wrong job secret)" in str(caught.value)
        assert await _closed_by_peer(sock)
    finally:
        sock.close()
    assert rank0.attached == {}
    assert [r.getMessage() for r in caplog.records if r.name == "asyncdist.transport"] == [
        f"rank 0 refused a connection from {here}: a peer claiming rank 2 failed authentication (wrong job secret)"
    ]


async def test_a_second_connection_from_a_rank_is_closed_after_the_handshake(job) -> None:
    ranks, addresses = await job(2)
    await asyncio.wait_for(ranks[1].mesh.dial(0, *addresses[0]), WAIT)
    await asyncio.wait_for(asyncio.gather(*(r.connected.wait() for r in ranks)), WAIT)
    first = (ranks[0].sock(1), ranks[1].sock(0))

    # rank 1 again, from a mesh of its own: the handshake passes (it is a rank
    # of the job), then rank 0 drops the stream and attaches nothing
    again = TestRank(job.job_id, 1, 2)
    try:
        await asyncio.wait_for(again.mesh.dial(0, *addresses[0]), WAIT)
        assert await _closed_by_peer(again.sock(0))
    finally:
        await again.close()
    assert (ranks[0].sock(1), ranks[1].sock(0)) == first
    # and the first stream still works
    await asyncio.get_running_loop().sock_sendall(first[1], b"still here")
    assert await _read_exactly(first[0], 10) == b"still here"


async def test_a_lower_rank_that_dials_is_closed_after_the_handshake(job) -> None:
    # the higher rank of a pair dials; a stream dialed the other way is dropped
    # even while the pair has no stream yet
    ranks, addresses = await job(2)
    await asyncio.wait_for(ranks[0].mesh.dial(1, *addresses[1]), WAIT)
    assert await _closed_by_peer(ranks[0].sock(1))
    assert ranks[1].attached == {}
    ranks[0].attached.pop(1)[0].close()  # closed by the peer; now the right direction
    await asyncio.wait_for(ranks[1].mesh.dial(0, *addresses[0]), WAIT)
    await asyncio.wait_for(asyncio.gather(*(r.connected.wait() for r in ranks)), WAIT)
    assert ranks[0].sock(1).getpeername() == ranks[1].sock(0).getsockname()


async def test_a_connection_that_stalls_in_the_handshake_is_dropped(job) -> None:
    (rank0,), addresses = await job(2, ranks=[0], handshake_timeout=0.1)
    loop = asyncio.get_running_loop()
    stalled = socket.create_connection(addresses[0])
    stalled.setblocking(False)
    try:
        await loop.sock_sendall(stalled, PREFIX.pack(100))  # a length, and then nothing
        assert await _closed_by_peer(stalled)
    finally:
        stalled.close()
    (rank1,), _ = await job(2, ranks=[1])
    await asyncio.wait_for(rank1.mesh.dial(0, *addresses[0]), WAIT)
    await asyncio.wait_for(rank0.connected.wait(), WAIT)
    assert list(rank0.attached) == [1]


async def test_after_close_the_port_refuses_connections(job) -> None:
    (rank0,), addresses = await job(2, ranks=[0])
    await rank0.mesh.close()
    late = TestRank(job.job_id, 1, 2)
    try:
        with pytest.raises(PeerLostError) as caught:
            await asyncio.wait_for(late.mesh.dial(0, *addresses[0]), WAIT)
    finally:
        await late.close()
    assert caught.value.rank == 0
    assert str(caught.value).startswith(f"cannot connect to rank 0 at 127.0.0.1:{addresses[0][1]}: ")


# -- the rendezvous timeout (Engine.connect over the mesh) ----------------------------


@pytest.mark.parametrize(
    ("started", "failing", "succeeding", "missing"),
    [
        # rank 2 listens (rank 3 reaches it) but never dials ranks 0 and 1
        ([0, 1, 2, 3], [0, 1], [3], [2]),
        # ranks 2 and 3 never start
        ([0, 1], [0, 1], [], [2, 3]),
    ],
    ids=["rank 2 never dials", "ranks 2 and 3 never start"],
)
async def test_a_timeout_names_the_ranks_that_did_not_connect(started, failing, succeeding, missing) -> None:
    job_id, n = uuid.uuid4().hex, 4
    engines = {r: Engine(Identity(job_id, r, n, SECRET)) for r in started}
    try:
        addresses = {r: await e.listen("127.0.0.1") for r, e in engines.items()}
        connecting = failing + succeeding
        results = await asyncio.gather(
            *(engines[r].connect(addresses, RENDEZVOUS) for r in connecting), return_exceptions=True
        )
        outcome = dict(zip(connecting, results))
        for r in failing:
            assert type(outcome[r]) is RendezvousError
            assert str(outcome[r]) == f"rank {r}: ranks {missing} did not connect within {RENDEZVOUS:g} s"
        for r in succeeding:
            assert outcome[r] is None
    finally:
        await asyncio.gather(*(e.close() for e in engines.values()))

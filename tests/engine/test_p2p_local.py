"""Point-to-point over real loopback sockets, all ranks in one event loop."""

from __future__ import annotations

import asyncio
import socket

import numpy as np
import pytest

import asyncdist.engine.mailbox
from asyncdist.errors import (
    BufferMismatchError,
    InvalidArgumentError,
    InvalidRankError,
    OperationTimeoutError,
    PeerLostError,
    UnsupportedBufferError,
    WrongThreadError,
)
from asyncdist.buffers.scratch import ScratchPool
from asyncdist.testing import local_world

WORLD_SIZES = [2, 4]


@pytest.mark.parametrize("n", WORLD_SIZES)
async def test_ring_exchange(n: int) -> None:
    async with local_world(n) as ranks:

        async def step(g):
            out = np.arange(1000, dtype=np.float64) * (g.rank + 1)
            got = np.zeros(1000, dtype=np.float64)
            left, right = (g.rank - 1) % n, (g.rank + 1) % n
            send = g.isend(out, right)
            sender = await g.recv(got, left)
            await send
            return sender, got

        results = await asyncio.gather(*(step(g) for g in ranks))
    for rank, (sender, got) in enumerate(results):
        left = (rank - 1) % n
        assert sender == left
        np.testing.assert_array_equal(got, np.arange(1000, dtype=np.float64) * (left + 1))


@pytest.mark.parametrize("n", WORLD_SIZES)
async def test_recv_from_any_source_reports_each_sender(n: int) -> None:
    async with local_world(n) as ranks:

        async def gather_at_zero():
            seen = {}
            for _ in range(n - 1):
                buf = np.zeros(3, dtype=np.int32)
                sender = await ranks[0].recv(buf, src=None)
                seen[sender] = buf.copy()
            return seen

        sends = [g.send(np.full(3, g.rank * 11, dtype=np.int32), 0) for g in ranks[1:]]
        seen, *_ = await asyncio.gather(gather_at_zero(), *sends)
    assert sorted(seen) == list(range(1, n))
    for sender, data in seen.items():
        np.testing.assert_array_equal(data, np.full(3, sender * 11, dtype=np.int32))


@pytest.mark.parametrize("wildcard", [False, True])
async def test_messages_with_one_tag_never_overtake(wildcard: bool) -> None:
    # Mixed sizes: small ones go through the decoder's buffer, large ones
    # straight into the destination; order must hold across both paths.
    sizes = [1, 100_000, 3, 70_000, 0, 5, 250_000, 2] * 4
    async with local_world(2) as (a, b):

        async def sender():
            works = [a.isend(np.full(size, i, dtype=np.int64), 1, tag=7) for i, size in enumerate(sizes)]
            for work in works:
                await work

        async def receiver():
            got = []
            for size in sizes:
                buf = np.empty(size, dtype=np.int64)
                await b.recv(buf, None if wildcard else 0, tag=7)
                got.append(buf)
            return got

        _, got = await asyncio.gather(sender(), receiver())
    for i, (size, buf) in enumerate(zip(sizes, got)):
        np.testing.assert_array_equal(buf, np.full(size, i, dtype=np.int64))


async def test_tags_select_messages_out_of_arrival_order() -> None:
    async with local_world(2) as (a, b):
        await a.send(np.array([5.0]), 1, tag=5)
        await a.send(np.array([7.0]), 1, tag=7)
        seven, five = np.zeros(1), np.zeros(1)
        await b.recv(seven, 0, tag=7)
        await b.recv(five, 0, tag=5)
    assert (seven[0], five[0]) == (7.0, 5.0)


@pytest.mark.parametrize(
    "dtype", ["bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
              "float16", "float32", "float64", "complex64", "complex128"]
)
async def test_numpy_dtypes_round_trip_bit_exact(dtype: str) -> None:
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, size=37 * np.dtype(dtype).itemsize, dtype=np.uint8)
    data = raw.view(dtype) if dtype != "bool" else raw.astype(bool)
    out = np.zeros_like(data)
    async with local_world(2) as (a, b):
        await asyncio.gather(a.send(data, 1), b.recv(out, 0))
    assert out.tobytes() == data.tobytes()


async def test_torch_dtypes_round_trip_bit_exact() -> None:
    torch = pytest.importorskip("torch")
    dtypes = [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.complex64, torch.complex128,
              torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool]
    dtypes += [getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64")
               if hasattr(torch, name)]
    gen = torch.Generator().manual_seed(0)
    async with local_world(2) as (a, b):
        for dtype in dtypes:
            raw = torch.randint(0, 256, (24 * torch.empty(0, dtype=dtype).element_size(),), dtype=torch.uint8, generator=gen)
            data = (raw % 2).bool() if dtype == torch.bool else raw.view(dtype).reshape(4, -1)
            out = torch.zeros_like(data)
            await asyncio.gather(a.send(data, 1), b.recv(out, 0))
            assert out.view(torch.uint8).tolist() == data.view(torch.uint8).tolist(), dtype


async def test_large_receive_lands_in_the_posted_buffer_without_a_staging_copy(monkeypatch) -> None:
    staged = []
    real_empty = np.empty

    def counting_empty(n, dtype):
        if n:  # (the world's set-up may leave a zero-byte message unexpected)
            staged.append(n)
        return real_empty(n, dtype)

    monkeypatch.setattr(asyncdist.engine.mailbox.np, "empty", counting_empty)
    monkeypatch.setattr(asyncdist.engine.mailbox, "pool", ScratchPool())  # empty: no block to reuse
    data = np.arange(4 << 20, dtype=np.float32)  # 16 MiB
    out = np.zeros_like(data)
    async with local_world(2) as (a, b):
        receiving = b.irecv(out, 0)  # posted before the message leaves
        await a.send(data, 1)
        assert await receiving == 0
        assert staged == []  # no engine-owned buffer: the payload went into `out`
        # A message that arrives before its receive is staged once, then copied.
        await a.send(data, 1)
        late = np.zeros_like(data)
        while not staged:
            await asyncio.sleep(0)  # let the loop read the unexpected message
        await b.recv(late, 0)
    assert staged == [data.nbytes]
    np.testing.assert_array_equal(out, data)
    np.testing.assert_array_equal(late, data)


async def test_64_mib_float32_round_trips_bit_exact() -> None:
    data = np.random.default_rng(1).standard_normal(16 << 20).astype(np.float32)
    back = np.empty_like(data)
    async with local_world(2) as (a, b):
        middle = np.empty_like(data)
        await asyncio.gather(a.send(data, 1), b.recv(middle, 0))
        await asyncio.gather(b.send(middle, 0), a.recv(back, 1))
    assert back.tobytes() == data.tobytes()


async def test_receive_buffer_of_wrong_dtype_or_size_names_both_sides() -> None:
    async with local_world(2) as (a, b):
        await a.send(np.zeros(4, dtype=np.float32), 1)
        with pytest.raises(BufferMismatchError, match=r"rank 0 sent float32\[4\].*rank 1.*int64\[4\]"):
            await b.recv(np.zeros(4, dtype=np.int64), 0)
        await a.send(np.zeros(4, dtype=np.float32), 1)
        with pytest.raises(BufferMismatchError, match=r"float32\[4\].*float32\[5\]"):
            await b.recv(np.zeros(5, dtype=np.float32), 0)
        # A posted receive that does not fit fails too, and the stream stays usable.
        wrong = b.irecv(np.zeros(2, dtype=np.float64), 0)
        await a.send(np.ones(3, dtype=np.float64), 1)
        with pytest.raises(BufferMismatchError):
            await wrong
        fine = np.zeros((2, 2), dtype=np.float64)  # same count, other shape: allowed as in torch
        await a.send(np.arange(4, dtype=np.float64), 1)
        await b.recv(fine, 0)
    np.testing.assert_array_equal(fine.ravel(), np.arange(4, dtype=np.float64))


async def test_bad_arguments_raise_before_anything_is_sent() -> None:
    torch = pytest.importorskip("torch")
    async with local_world(2) as (a, _):
        with pytest.raises(InvalidRankError, match="should not be the same"):
            await a.send(np.zeros(1), 0)
        with pytest.raises(InvalidRankError, match="invalid dst 2"):
            await a.send(np.zeros(1), 2)
        with pytest.raises(InvalidRankError):
            await a.recv(np.zeros(1), -1)
        with pytest.raises(InvalidArgumentError, match="tag"):
            await a.send(np.zeros(1), 1, tag="x")
        with pytest.raises(UnsupportedBufferError, match="Tensors must be contiguous"):
            await a.send(torch.zeros(4, 4).t(), 1)
        with pytest.raises(UnsupportedBufferError):
            await a.send([1, 2, 3], 1)


async def test_work_handles_from_the_loop_and_from_threads() -> None:
    async with local_world(2) as (a, b):
        out = np.zeros(8)
        receive = b.irecv(out, None)
        assert not receive.is_completed() and receive.exception() is None
        with pytest.raises(WrongThreadError):
            receive.wait()
        send = a.isend(np.arange(8.0), 1)
        # Another thread blocks in wait() while the loop completes the operation.
        assert await asyncio.to_thread(receive.wait, 10.0) is True
        await send
        assert receive.is_completed() and receive.is_success()
        assert await receive == 0
        assert receive.result()[0] is out
        np.testing.assert_array_equal(out, np.arange(8.0))
        pending = b.irecv(np.zeros(1), 0, tag=99)
        with pytest.raises(OperationTimeoutError, match="Timed out after 0.05 s"):
            await asyncio.to_thread(pending.wait, 0.05)
        await a.send(np.ones(1), 1, tag=99)
        assert await pending == 0


async def test_operations_time_out_naming_the_operation() -> None:
    async with local_world(2) as (a, b):
        b.timeout = 0.2
        with pytest.raises(OperationTimeoutError, match=r"rank 1: recv from rank 0 \(tag 3, group"):
            await b.recv(np.zeros(1), 0, tag=3)
        # The timed-out receive was withdrawn: the next message goes to the next receive.
        await a.send(np.full(1, 42.0), 1, tag=3)
        b.timeout = 30.0
        got = np.zeros(1)
        await b.recv(got, 0, tag=3)
    assert got[0] == 42.0


async def test_losing_a_peer_fails_the_operations_that_wait_on_it(virtual_clock) -> None:
    async with local_world(3) as (a, b, c):
        waiting = c.irecv(np.zeros(1), 0)
        waiting_any = c.irecv(np.zeros(1), None, tag=1)
        unrelated = c.irecv(np.zeros(1), 1, tag=2)
        a.engine._connections[2].close()  # rank 0's stream to rank 2 breaks: as a crash, seen from rank 2
        for work in (waiting, waiting_any):  # any-source: the lost rank may have been the sender (ULFM)
            with pytest.raises(PeerLostError, match="rank 0") as info:
                await work
            assert info.value.rank == 0
        with pytest.raises(PeerLostError):
            await c.send(np.zeros(1), 0)
        # Ranks not involved carry on.
        await b.send(np.full(1, 3.0), 2, tag=2)
        assert await unrelated == 1


async def test_a_rank_that_leaves_in_order_fails_only_what_names_it() -> None:
    async with local_world(3) as (a, b, c):
        named = c.irecv(np.zeros(1), 0)
        from_anyone = c.irecv(np.zeros(1), None, tag=1)
        await a.close()  # says goodbye: it will send nothing more
        with pytest.raises(PeerLostError, match="rank 0 closed its process group"):
            await named
        assert not from_anyone.is_completed()  # rank 1 may still send
        await b.send(np.full(1, 5.0), 2, tag=1)
        assert await from_anyone == 1
        last = c.irecv(np.zeros(1), None, tag=3)
        await b.close()  # now every possible sender has gone
        with pytest.raises(PeerLostError, match="rank 1"):
            await last


async def test_a_stranger_on_the_port_is_refused_and_the_rank_carries_on() -> None:
    def knock(address, junk: bytes) -> bytes:
        with socket.create_connection(address) as stranger:
            stranger.sendall(junk)
            try:
                stranger.shutdown(socket.SHUT_WR)
            except OSError:  # the rank refused before we finished: nothing left to read
                return b""
            reply = b""
            try:
                while chunk := stranger.recv(1024):  # until the rank closes it
                    reply += chunk
            except ConnectionResetError:  # closed with our junk unread: also a refusal
                pass
            return reply

    async with local_world(2) as (a, b):
        for junk in (b"GET / HTTP/1.1\r\n\r\n", b"\x00\x00\x00\x10" + b"\xff" * 16, b""):
            reply = await asyncio.to_thread(knock, a.engine.address, junk)
            assert b"REJECT" in reply or reply == b""
        got = np.zeros(2)
        await asyncio.gather(b.send(np.array([1.0, 2.0]), 0), a.recv(got, 1))
    np.testing.assert_array_equal(got, [1.0, 2.0])


async def test_several_threads_can_wait_on_one_work() -> None:
    async with local_world(2) as (a, b):
        out = np.zeros(3)
        receive = b.irecv(out, 0)
        waiters = [asyncio.to_thread(receive.wait, 30.0) for _ in range(4)]
        pending = asyncio.gather(*waiters)
        await a.send(np.arange(3.0), 1)
        assert await pending == [True] * 4
    np.testing.assert_array_equal(out, np.arange(3.0))

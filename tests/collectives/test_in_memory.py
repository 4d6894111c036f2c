"""The in-memory channel keeps the rules algorithms rely on: order, fit, folds, links."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from asyncdist.buffers.host import as_host_buffer
from asyncdist.collectives.in_memory import InMemoryChannel, InMemoryNetwork, run_ranks
from asyncdist.errors import (
    BufferMismatchError,
    CollectiveMismatchError,
    InvalidRankError,
    OperationTimeoutError,
)
from asyncdist.reduce.kernels import ReduceOp, folder


def host(array: np.ndarray):
    return as_host_buffer(array, writable=True)


async def test_messages_from_one_peer_arrive_in_the_order_they_were_sent() -> None:
    network = InMemoryNetwork(2)
    sender, receiver = network.channel(0), network.channel(1)
    early = np.zeros(1, np.int64)
    first = receiver.start_recv(host(early), 0)  # posted before the message
    for value in range(4):
        sender.start_send(host(np.array([value])), 1)
    late = [np.zeros(1, np.int64) for _ in range(3)]
    for out in late:  # posted after the messages
        await receiver.recv(host(out), 0)
    await receiver.wait_recv(first, 0)
    assert [int(early[0])] + [int(out[0]) for out in late] == [0, 1, 2, 3]
    assert network.pending() == []


async def test_calls_with_different_tags_never_take_each_others_messages() -> None:
    network = InMemoryNetwork(2)
    first_call, second_call = np.zeros(1), np.zeros(1)
    pending = network.channel(1, tag=1).start_recv(host(first_call), 0)
    await network.channel(0, tag=2).send(host(np.array([2.0])), 1)
    await network.channel(1, tag=2).recv(host(second_call), 0)
    assert not pending.future.done() and second_call[0] == 2.0
    network.channel(1, tag=1).withdraw(pending)
    assert network.pending() == []


@pytest.mark.parametrize(
    ("sent", "received"),
    [(np.zeros(3, np.float32), np.zeros(3, np.float64)), (np.zeros(3, np.int8), np.zeros(4, np.int8))],
    ids=["dtype", "count"],
)
async def test_a_message_that_does_not_fit_fails_its_receive(sent: np.ndarray, received: np.ndarray) -> None:
    async def exchange(channel: InMemoryChannel) -> None:
        if channel.rank == 0:
            await channel.send(host(sent), 1)
        else:
            await channel.recv(host(received), 0)

    with pytest.raises(BufferMismatchError, match="rank 0 sent .* on rank 1"):
        await run_ranks(2, exchange)


@pytest.mark.parametrize("piece", [None, 1, 8, 12])
async def test_a_fold_combines_the_message_piece_by_piece(piece: int | None) -> None:
    acc = np.arange(7, dtype=np.int32)
    network = InMemoryNetwork(2, fold_piece_bytes=piece)
    recv = network.channel(1).start_recv(host(acc), 0, folder(ReduceOp.SUM, host(acc)))
    await network.channel(0).send(host(np.full(7, 10, np.int32)), 1)
    await network.channel(1).wait_recv(recv, 0)
    np.testing.assert_array_equal(acc, np.arange(7) + 10)


async def test_a_by_memory_link_hands_over_on_match_and_a_socket_link_copies_at_once() -> None:
    network = InMemoryNetwork(3, by_memory=lambda src, dst: dst == 1)
    data = np.array([1, 2], np.int16)
    by_memory = network.channel(0).start_send(host(data), 1)
    assert network.channel(1).by_memory(0, sending=False) and network.channel(0).by_memory(1, sending=True)
    assert network.channel(0).start_send(host(data), 2) is None  # copied already
    data[:] = 7  # the by-memory receiver reads the sender's buffer as it is when it matches
    assert by_memory is not None and not by_memory.done()
    into_1, into_2 = np.zeros(2, np.int16), np.zeros(2, np.int16)
    await network.channel(1).recv(host(into_1), 0)
    await network.channel(2).recv(host(into_2), 0)
    assert by_memory.done() and into_1.tolist() == [7, 7] and into_2.tolist() == [1, 2]


async def test_ranks_that_wait_for_each_other_fail_at_once_naming_what_they_wait_for() -> None:
    async def both_receive(channel: InMemoryChannel) -> None:
        await channel.recv(host(np.zeros(1)), 1 - channel.rank)

    with pytest.raises(OperationTimeoutError, match="deadlock.*rank 0 waits for a message from rank 1"):
        await run_ranks(2, both_receive, timeout=60)


async def test_a_rank_that_waits_for_something_else_times_out() -> None:
    async def one_receives_one_sleeps(channel: InMemoryChannel) -> None:
        if channel.rank == 0:
            await channel.recv(host(np.zeros(1)), 1)
        else:
            await asyncio.Event().wait()

    with pytest.raises(OperationTimeoutError, match="no progress in 0.05 s; rank 0 waits for a message from rank 1"):
        await run_ranks(2, one_receives_one_sleeps, timeout=0.05)


async def test_a_message_nobody_received_is_reported() -> None:
    async def one_too_many(channel: InMemoryChannel) -> None:
        if channel.rank == 0:
            await channel.send(host(np.zeros(2)), 1)

    with pytest.raises(CollectiveMismatchError, match=r"rank 0 sent rank 1 float64\[2\] .* that no receive took"):
        await run_ranks(2, one_too_many)


async def test_a_rank_may_not_message_itself_or_a_rank_outside_the_group() -> None:
    network = InMemoryNetwork(2)
    with pytest.raises(InvalidRankError):
        network.channel(0).start_send(host(np.zeros(1)), 0)
    with pytest.raises(InvalidRankError):
        network.channel(0).start_recv(host(np.zeros(1)), 2)
    with pytest.raises(InvalidRankError):
        InMemoryNetwork(0)


async def test_run_ranks_returns_each_ranks_result_by_rank() -> None:
    async def rank_times_ten(channel: InMemoryChannel) -> int:
        return channel.rank * 10

    assert await run_ranks(3, rank_times_ten) == [0, 10, 20]

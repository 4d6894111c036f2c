"""The shared-memory ring by itself: bytes in order, wrap-around, a full
ring, nothing unpublished seen, switches to the socket, the wake-up
protocol, and who may open it.

Both ends run in this process (the writer opens the reader's ring through
``/proc/self/fd``) or in a child process started for the test; the reference
is the byte stream that was written.
"""

from __future__ import annotations

import multiprocessing
import os

import numpy as np
import pytest

from asyncdist.transport.shm_ring import CONTROL_BYTES, SWITCH_SLOTS, ShmRing, supported

pytestmark = pytest.mark.skipif(not supported(), reason="shared-memory rings need Linux on x86-64")

CAPACITY = 4096


@pytest.fixture
def ring_pair():
    reader, fd, nonce = ShmRing.create(CAPACITY)
    writer = ShmRing.attach(os.getpid(), fd, nonce, CAPACITY)
    os.close(fd)
    yield reader, writer
    writer.close()
    reader.close()


def _read(reader: ShmRing, n: int) -> bytes:
    out = bytearray(n)
    assert reader.get(memoryview(out), n) == n
    return bytes(out)


def _put_what_fits(writer: ShmRing, chunk: memoryview) -> int:
    n = chunk.nbytes
    while n and not writer.fits(n):
        n -= 1
    writer.put(chunk[:n])
    return n


def test_bytes_arrive_in_order_across_many_wrap_arounds(ring_pair) -> None:
    reader, writer = ring_pair
    rng = np.random.default_rng(7)
    stream = rng.integers(0, 256, 40 * CAPACITY, dtype=np.uint8).tobytes()
    received = bytearray()
    sent = 0
    while sent < len(stream) or reader.readable():
        # Odd sizes on both sides, so that pieces straddle the ring's end.
        chunk = memoryview(stream)[sent : sent + int(rng.integers(1, 3 * CAPACITY // 2))]
        sent += _put_what_fits(writer, chunk)
        writer.publish()
        want = min(reader.readable(), int(rng.integers(1, CAPACITY)))
        received += _read(reader, want)
    assert bytes(received) == stream


def test_a_full_ring_takes_nothing_more_until_the_reader_makes_room(ring_pair) -> None:
    reader, writer = ring_pair
    data = bytes(range(256)) * (2 * CAPACITY // 256)
    assert writer.fits(CAPACITY) and not writer.fits(CAPACITY + 1)
    writer.put(memoryview(data)[:CAPACITY])
    writer.publish()
    assert not writer.fits(1)
    assert reader.readable() == CAPACITY
    assert _read(reader, 100) == data[:100]
    assert writer.fits(100) and not writer.fits(101)
    writer.put(memoryview(data)[CAPACITY : CAPACITY + 100])
    writer.publish()
    assert _read(reader, CAPACITY) == data[100 : CAPACITY + 100]
    assert reader.readable() == 0


def test_nothing_written_is_visible_before_it_is_published(ring_pair) -> None:
    reader, writer = ring_pair
    writer.put(memoryview(b"abc"))
    assert reader.readable() == 0
    writer.publish()
    assert reader.readable() == 3
    writer.put(memoryview(b"half a frame"))  # the writer dies here: the reader never sees it
    writer.close()
    assert _read(reader, 3) == b"abc"
    assert reader.readable() == 0


def test_the_reader_stops_at_each_switch_until_it_resumes_from_it(ring_pair) -> None:
    reader, writer = ring_pair
    for piece in (b"one", b"two"):
        writer.put(memoryview(piece))
        writer.publish()
        first = writer.switch()
        writer.put(memoryview(b"-after"))  # written once back from the switch
        writer.publish()
        assert _read(reader, reader.readable()) == piece  # no further than the switch
        assert reader.readable() == 0
        reader.resume(first)
        assert _read(reader, reader.readable()) == b"-after"


def test_a_writer_comes_back_from_the_socket_only_while_a_switch_slot_is_free(ring_pair) -> None:
    reader, writer = ring_pair
    numbers = []
    for _ in range(SWITCH_SLOTS - 1):
        assert writer.can_switch_again()
        numbers.append(writer.switch())
    assert not writer.can_switch_again()  # the reader resumed from none of them yet
    reader.resume(numbers[0])
    assert writer.can_switch_again()
    assert numbers == list(range(1, SWITCH_SLOTS))


def test_a_writer_rings_once_until_the_reader_acts_and_never_while_it_polls(ring_pair) -> None:
    reader, writer = ring_pair
    assert writer.wake_needed()  # reader asleep, nothing outstanding
    assert not writer.wake_needed()  # the first wake-up is not answered yet
    reader.acknowledge_wake()
    assert writer.wake_needed()
    reader.acknowledge_wake()
    reader.set_polling(True)
    assert not writer.wake_needed()
    reader.set_polling(False)
    assert writer.wake_needed()


def test_only_the_offered_ring_can_be_opened() -> None:
    reader, fd, nonce = ShmRing.create(CAPACITY)
    try:
        with pytest.raises(OSError, match="not the ring offered"):
            ShmRing.attach(os.getpid(), fd, bytes(16), CAPACITY)
        with pytest.raises(OSError, match="not a ring of"):
            ShmRing.attach(os.getpid(), fd, nonce, 2 * CAPACITY)
        with pytest.raises(OSError, match="malformed ring offer"):
            ShmRing.attach(os.getpid(), fd, nonce, 3000)
        with pytest.raises(OSError):
            ShmRing.attach(os.getpid(), 987654, nonce, CAPACITY)  # no such descriptor
    finally:
        os.close(fd)
        reader.close()


@pytest.mark.parametrize("capacity", [1000, 2048, 6144])
def test_a_capacity_must_be_a_power_of_two_of_a_page_or_more(capacity: int) -> None:
    with pytest.raises(ValueError, match="power of two"):
        ShmRing.create(capacity)


def _write_from_child(pid: int, fd: int, nonce: bytes, total: int) -> None:
    writer = ShmRing.attach(pid, fd, nonce, CAPACITY)
    data = (np.arange(total, dtype=np.uint64) % 251).astype(np.uint8).tobytes()
    view, sent = memoryview(data), 0
    while sent < total:  # spins on a full ring: the parent reads meanwhile
        sent += _put_what_fits(writer, view[sent : sent + 1000])
        writer.publish()
    writer.close()


def test_another_process_writes_what_this_one_reads() -> None:
    total = 50 * CAPACITY
    reader, fd, nonce = ShmRing.create(CAPACITY)
    child = multiprocessing.get_context("fork").Process(target=_write_from_child, args=(os.getpid(), fd, nonce, total))
    child.start()
    received = bytearray()
    try:
        while len(received) < total:
            if reader.readable():
                received += _read(reader, reader.readable())
            elif not child.is_alive() and not reader.readable():
                break  # it died short of the total: compared below
        child.join(timeout=30)
    finally:
        os.close(fd)
        reader.close()
    assert child.exitcode == 0
    assert bytes(received) == (np.arange(total, dtype=np.uint64) % 251).astype(np.uint8).tobytes()


def test_the_memory_is_one_page_of_control_and_the_data() -> None:
    reader, fd, _ = ShmRing.create(CAPACITY)
    try:
        assert os.fstat(fd).st_size == CONTROL_BYTES + CAPACITY
    finally:
        os.close(fd)
        reader.close()

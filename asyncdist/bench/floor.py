"""The socket floor: one 8 B message between two processes, one way, in microseconds.

A small collective or ping-pong over sockets cannot beat one wake-up of a
peer through the kernel: a ``send`` on one side, a ``recv`` that blocks (or
an event loop that polls) on the other. That cost varies several times from
machine to machine and from minute to minute on a shared one (25-32 us on a
busy 2-core VM, 10-13 us on a quiet one), so the bench measures it in every
run, just before the series, and prints each small row as a multiple of it:
the multiple is what carries from one machine to another.

Two socket floors are measured, each as a ping-pong of 8 B over TCP on
loopback (``TCP_NODELAY``, as asyncdist's links), half the round trip:

* ``blocking``: plain blocking sockets, ``sendall`` then ``recv``;
* ``uvloop``: an :class:`asyncio.Protocol` on the loop asyncdist's ranks
  run (uvloop where installed, unless ``ASYNCDIST_LOOP=asyncio``), the best
  an event loop does.

:attr:`Floor.us` is the smaller of the two. A third figure, ``shm_us``, is
what goes below it: the same ping-pong through two of asyncdist's
shared-memory rings (:mod:`asyncdist.transport.shm_ring`), both sides
spinning, in Python, with none of the runtime around them: the least a
same-host message costs here. Each is the median of :data:`REPS`
repetitions of :data:`ROUND_TRIPS` round trips, against a child process
started just for it.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import socket
import statistics
from dataclasses import dataclass
from time import perf_counter
from typing import cast

from ..loop.choice import new_event_loop
from ..transport.shm_ring import ShmRing, supported

__all__ = ["Floor", "measure", "ROUND_TRIPS", "REPS", "MESSAGE"]

ROUND_TRIPS = 300
REPS = 5
MESSAGE = b"\0" * 8


@dataclass(frozen=True, slots=True)
class Floor:
    """The floors of one run, microseconds one way (median of repetitions)."""

    blocking_us: float
    uvloop_us: float
    loop: str  # "uvloop" or "asyncio": what the event-loop floor ran on
    shm_us: float | None = None  # through shared-memory rings (None: not on this platform)

    @property
    def us(self) -> float:
        """The floor the small rows are compared with: the lower of the two."""
        return min(self.blocking_us, self.uvloop_us)

    def describe(self) -> str:
        return (f"socket floor (8 B ping-pong over TCP loopback, one way): {self.us:.1f} us "
                f"(blocking sockets {self.blocking_us:.1f} us, {self.loop} Protocol {self.uvloop_us:.1f} us)"
                + ("" if self.shm_us is None else f"; shared-memory rings {self.shm_us:.2f} us"))


def _exact(sock: socket.socket, n: int) -> None:
    got = 0
    while got < n:
        chunk = sock.recv(n - got)
        if not chunk:
            raise ConnectionError("the floor's echo process closed its socket")
        got += len(chunk)


def _echo(port: int, total: int) -> None:
    """Child: echo ``total`` 8 B messages back on a blocking socket."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(total):
            _exact(sock, len(MESSAGE))
            sock.sendall(MESSAGE)


def _blocking(sock: socket.socket) -> list[float]:
    times = []
    for _ in range(REPS):
        start = perf_counter()
        for _ in range(ROUND_TRIPS):
            sock.sendall(MESSAGE)
            _exact(sock, len(MESSAGE))
        times.append((perf_counter() - start) / ROUND_TRIPS / 2 * 1e6)
    return times


class _PingPong(asyncio.Protocol):
    """Send 8 B whenever 8 B came back, ``ROUND_TRIPS`` times per :meth:`start`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.pending = self.left = 0
        self.done: asyncio.Future[None] = loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport, but writes as one

    def start(self) -> asyncio.Future[None]:
        assert self.transport is not None
        self.left, self.pending, self.done = ROUND_TRIPS, 0, self.loop.create_future()
        self.transport.write(MESSAGE)
        return self.done

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.pending += len(data)
        while self.pending >= len(MESSAGE):
            self.pending -= len(MESSAGE)
            self.left -= 1
            if self.left:
                self.transport.write(MESSAGE)
            elif not self.done.done():
                self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(exc or ConnectionError("the floor's echo process closed its socket"))


async def _protocol(sock: socket.socket) -> list[float]:
    loop = asyncio.get_running_loop()
    transport, ping = await loop.connect_accepted_socket(lambda: _PingPong(loop), sock)
    times = []
    try:
        for _ in range(REPS):
            start = perf_counter()
            await ping.start()
            times.append((perf_counter() - start) / ROUND_TRIPS / 2 * 1e6)
    finally:
        transport.close()
    return times


_RING_BYTES = 4096
_LOOKS_PER_YIELD = 256


def _take(ring: ShmRing, dest: memoryview) -> None:
    """Spin until ``dest.nbytes`` are readable, and read them. Every
    :data:`_LOOKS_PER_YIELD` looks the core is yielded: where the two
    processes share one, the other must get to run (a yield per look would
    cost more than the message)."""
    looks = 0
    while ring.readable() < dest.nbytes:
        looks += 1
        if looks % _LOOKS_PER_YIELD == 0:
            os.sched_yield()
    ring.get(dest, dest.nbytes)


def _ring_echo(pid: int, inbound: tuple[int, bytes], outbound: tuple[int, bytes], total: int) -> None:
    """Child: echo ``total`` 8 B messages from one ring of process ``pid`` into the other."""
    reader = ShmRing.attach(pid, *inbound, _RING_BYTES)
    writer = ShmRing.attach(pid, *outbound, _RING_BYTES)
    message = memoryview(bytearray(len(MESSAGE)))
    for _ in range(total):
        _take(reader, message)
        writer.put(message)
        writer.publish()


def _shared_memory(context: multiprocessing.context.SpawnContext) -> float:
    """The 8 B ping-pong through two rings, one way, median of repetitions."""
    (to_child, child_fd, child_nonce), (from_child, fd, nonce) = ShmRing.create(_RING_BYTES), ShmRing.create(_RING_BYTES)
    child = context.Process(target=_ring_echo, args=(os.getpid(), (child_fd, child_nonce), (fd, nonce), REPS * ROUND_TRIPS),
                            daemon=True)  # fmt: skip
    child.start()
    message, reply = memoryview(MESSAGE), memoryview(bytearray(len(MESSAGE)))
    times = []
    try:
        for _ in range(REPS):
            start = perf_counter()
            for _ in range(ROUND_TRIPS):
                to_child.put(message)
                to_child.publish()
                _take(from_child, reply)
            times.append((perf_counter() - start) / ROUND_TRIPS / 2 * 1e6)
    finally:
        child.join(timeout=10)
        if child.is_alive():
            child.kill()
        for descriptor in (child_fd, fd):
            os.close(descriptor)
    return statistics.median(times)


def measure() -> Floor:
    """Measure both floors (blocks well under a second on an idle machine).

    Raises:
        OSError, ConnectionError: loopback TCP does not work here.
    """
    total = 2 * REPS * ROUND_TRIPS
    context = multiprocessing.get_context("spawn")
    with socket.create_server(("127.0.0.1", 0)) as server:
        child = context.Process(target=_echo, args=(server.getsockname()[1], total), daemon=True)
        child.start()
        try:
            sock, _ = server.accept()
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with sock:
                blocking = _blocking(sock)
                loop = new_event_loop()  # uvloop's where installed (asyncdist's own choice of loop)
                kind = "asyncio" if isinstance(loop, asyncio.BaseEventLoop) else type(loop).__module__.split(".")[0]
                try:
                    evented = loop.run_until_complete(_protocol(sock.dup()))
                finally:
                    loop.close()
        finally:
            child.join(timeout=10)  # it exits after its last echo
            if child.is_alive():
                child.kill()
    shm = _shared_memory(context) if supported() else None
    return Floor(statistics.median(blocking), statistics.median(evented), kind, shm)

"""The TCP store's server under strangers: bounded connections, memory and log lines."""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
from datetime import timedelta

import pytest

from asyncdist.rendezvous import tcp_admission, tcp_server
from asyncdist.rendezvous.tcp_protocol import OP_GET, OP_SET, encode_frame
from asyncdist.rendezvous.tcp_store import TCPStore

SECRET = "s3cret-of-the-job"
TIMEOUT = timedelta(seconds=5)


@pytest.fixture(autouse=True)
def no_secret_in_environment(monkeypatch) -> None:
    monkeypatch.delenv("ASYNCDIST_SECRET", raising=False)


def _master(secret: str | None) -> TCPStore:
    return TCPStore("127.0.0.1", 0, is_master=True, timeout=TIMEOUT, wait_for_workers=False, secret=secret)


def _until(condition, what: str, timeout: float = 10.0) -> None:
    """Poll the server's state (it runs on its own thread) until ``condition()``."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.mark.timeout(30)
def test_strangers_waiting_to_authenticate_are_bounded_and_logged_briefly(caplog) -> None:
    master = _master(SECRET)
    server = master._server
    assert server is not None
    socks: list[socket.socket] = []
    try:
        with caplog.at_level(logging.WARNING, logger="asyncdist.store"):
            for _ in range(300):  # silent strangers, held open
                socks.append(socket.create_connection(("127.0.0.1", master.port), timeout=5))
            _until(lambda: len(server.connections) <= tcp_admission.MAX_UNAUTHENTICATED
                   and server.refusals.total["evicted"] >= 300 - tcp_admission.MAX_UNAUTHENTICATED,
                   "the oldest strangers to be closed")
            # A client of the job is still served.
            client = TCPStore("127.0.0.1", master.port, timeout=TIMEOUT, secret=SECRET)
            client.set("k", b"v")
            assert master.get("k") == b"v"
            client.close()
        assert len(caplog.records) < 10, [r.getMessage() for r in caplog.records]
    finally:
        for s in socks:
            s.close()
        master.close()


def _partial_frame(port: int, announced: int, sent: int, started: threading.Event) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(struct.pack(">I", announced))
    started.set()
    sock.settimeout(1.0)
    try:
        sock.sendall(b"\x00" * sent)
    except socket.timeout:  # the server stopped reading us: what this test wants
        pass
    return sock


@pytest.mark.timeout(30)
def test_incomplete_frames_hold_a_bounded_number_of_bytes(monkeypatch) -> None:
    # Scaled down from 8 x 60 MiB (measured in docs/reliability.md) to keep the test light.
    monkeypatch.setattr(tcp_admission, "MAX_PARTIAL_BYTES", 1 << 20)
    announced, sent = 8 << 20, 6 << 20
    master = _master(None)  # without a secret every connection may send large frames
    server = master._server
    assert server is not None
    socks: list[socket.socket] = []
    try:
        first = threading.Event()
        socks.append(_partial_frame(master.port, announced, sent, first))  # the oldest: read on
        threads = []
        results: list[socket.socket] = []
        for _ in range(7):
            t = threading.Thread(target=lambda: results.append(
                _partial_frame(master.port, announced, sent, threading.Event())))
            t.start()
            threads.append(t)
        for t in threads:
            t.join()
        socks += results
        partial = server.partial
        _until(lambda: len(partial.held) == 8 and next(iter(partial.held.values())) == 4 + sent,
               "the oldest frame to be read")
        others = partial.total - (4 + sent)
        # The others hold at most the limit plus one read (256 KiB) each; without
        # the bound they would hold everything sent (7 x 6 MiB).
        assert others <= (1 << 20) + 7 * (256 << 10), others
        assert len(partial.paused) >= 6
        # A request that arrives whole is still served.
        master.set("k", b"v")
        assert master.get("k") == b"v"
    finally:
        for s in socks:
            s.close()
        master.close()


@pytest.mark.timeout(30)
def test_one_connection_queues_at_most_one_frame_s_worth_of_requests(monkeypatch, caplog) -> None:
    monkeypatch.setattr(tcp_server, "MAX_FRAME_BYTES", 2**20)
    master = _master("")
    try:
        with caplog.at_level(logging.WARNING, logger="asyncdist.store"), \
                socket.create_connection(("127.0.0.1", master.port), timeout=10) as sock:
            # The first request parks (its key never comes); the SETs behind it queue.
            sock.sendall(encode_frame([OP_GET, "never", 20.0]))
            sock.sendall(b"".join(encode_frame([OP_SET, f"k{i}", b"x" * 300_000]) for i in range(4)))
            try:
                assert sock.recv(1) == b""
            except ConnectionResetError:
                pass
        assert any("bytes of requests queued" in r.getMessage() for r in caplog.records)
        assert master.num_keys() == 0
    finally:
        master.close()

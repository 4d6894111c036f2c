"""TCPStore: the protocol's pure functions, and the server against bad clients.

Store semantics shared with the other stores are in test_stores.py.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
from datetime import timedelta
from typing import Callable, Iterator

import msgpack
import pytest

from asyncdist.errors import FrameTooLargeError, ProtocolError, StoreError, StoreLostError, StoreTimeoutError
from asyncdist.rendezvous.tcp_protocol import (
    MAX_FRAME_BYTES,
    OP_GET,
    OP_SET,
    OP_WAIT,
    STATUS_OK,
    STATUS_TIMEOUT,
    FrameDecoder,
    decode_request,
    decode_response,
    encode_frame,
)
from asyncdist.rendezvous.tcp_store import TCPStore


def _server_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "asyncdist-tcpstore"]


def _eventually(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


@pytest.fixture
def master() -> Iterator[TCPStore]:
    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10))
    yield store
    store.close()


def _raw(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


# -- encoding, without sockets ---------------------------------------------


def test_frames_round_trip_through_the_decoder_byte_by_byte() -> None:
    frames = encode_frame([OP_SET, "k", b"\x00v"]) + encode_frame([OP_WAIT, ["a", "b"], 1.5])
    decoder = FrameDecoder()
    bodies = [body for i in range(len(frames)) for body in decoder.feed(frames[i : i + 1])]
    assert [decode_request(b) for b in bodies] == [(OP_SET, ["k", b"\x00v"]),
                                                  (OP_WAIT, [["a", "b"], 1.5])]
    assert decode_response(encode_frame([STATUS_TIMEOUT, ["b"]])[4:]) == (STATUS_TIMEOUT, ["b"])


def test_oversized_length_is_refused_before_the_body_arrives() -> None:
    with pytest.raises(FrameTooLargeError):
        FrameDecoder().feed(struct.pack(">I", MAX_FRAME_BYTES + 1))


@pytest.mark.parametrize("message", [
    [99, "k"],  # unknown op
    [OP_SET, "k"],  # missing argument
    [OP_SET, b"k", b"v"],  # key not str
    [OP_SET, "k", "v"],  # value not bytes
    [OP_GET, "k", -1.0],  # negative timeout
    [OP_WAIT, "ab", 1.0],  # keys not a list
    [True, "k"],  # op not an int
    {"op": 1},  # not a list
    [],
])
def test_decode_request_rejects_malformed(message) -> None:
    with pytest.raises(ProtocolError):
        decode_request(msgpack.packb(message, use_bin_type=True))


def test_decode_rejects_garbage_bytes() -> None:
    with pytest.raises(ProtocolError):
        decode_request(b"\xc1\xc1")
    with pytest.raises(ProtocolError):
        decode_response(msgpack.packb([STATUS_OK]))


# -- the server against bad clients ----------------------------------------


@pytest.mark.parametrize("junk", [
    struct.pack(">I", 5) + b"\xc1junk",  # not msgpack
    struct.pack(">I", 0xFFFFFFFF),  # a 4 GiB length prefix
    encode_frame([OP_SET, 1, 2]),  # well-formed msgpack, wrong argument types
])
def test_malformed_input_closes_only_that_connection(master, junk, caplog) -> None:
    client = TCPStore("127.0.0.1", master.port, timeout=timedelta(seconds=10))
    try:
        client.set("before", "1")
        with caplog.at_level(logging.WARNING, logger="asyncdist.store"), _raw(master.port) as raw:
            raw.sendall(junk)
            assert raw.recv(1) == b""  # the server closed it
            assert _eventually(lambda: any(r.name == "asyncdist.store" for r in caplog.records))
        client.set("after", "2")
        assert master.get("before") == b"1" and master.get("after") == b"2"
    finally:
        client.close()


def test_client_leaving_mid_wait_leaves_no_waiter(master) -> None:
    server = master._server
    assert server is not None
    with _raw(master.port) as raw:
        raw.sendall(encode_frame([OP_WAIT, ["never"], 60.0]))
        assert _eventually(lambda: "never" in server._waiters)
    assert _eventually(lambda: not server._waiters), server._waiters
    master.set("never", "now")  # nobody left to wake; the server still serves
    assert master.get("never") == b"now"


def test_raw_client_gets_timeout_status(master) -> None:
    with _raw(master.port) as raw:
        raw.sendall(encode_frame([OP_GET, "absent", 0.05]))
        (n,) = struct.unpack(">I", raw.recv(4))
        assert decode_response(raw.recv(n)) == (STATUS_TIMEOUT, ["absent"])


# -- lifecycle --------------------------------------------------------------


def test_master_waits_for_workers() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    made: dict = {}

    def make_master() -> None:
        made["master"] = TCPStore("127.0.0.1", port, world_size=3, is_master=True,
                                  timeout=timedelta(seconds=10), master_listen_fd=listener.detach())

    thread = threading.Thread(target=make_master)
    thread.start()
    workers = [TCPStore("127.0.0.1", port, world_size=3, timeout=timedelta(seconds=10))]
    thread.join(0.1)
    assert thread.is_alive(), "the master returned with 2 of 3 workers"
    workers.append(TCPStore("127.0.0.1", port, world_size=3, timeout=timedelta(seconds=10)))
    thread.join(10)
    assert not thread.is_alive()
    master = made["master"]
    assert master.port == port
    assert master.num_keys() == 0  # workers are not counted through a key
    for store in workers + [master]:
        store.close()


def test_too_few_workers_times_out_and_stops_the_server() -> None:
    before = len(_server_threads())
    with pytest.raises(StoreTimeoutError, match="1 of 2 workers"):
        TCPStore("127.0.0.1", 0, world_size=2, is_master=True, timeout=timedelta(seconds=0.2))
    assert len(_server_threads()) == before


def test_close_stops_the_server_thread() -> None:
    before = len(_server_threads())
    store = TCPStore("127.0.0.1", 0, is_master=True)
    assert len(_server_threads()) == before + 1
    store.close()
    store.close()
    assert len(_server_threads()) == before


def test_port_in_use_raises_store_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        with pytest.raises(StoreError, match=f"127.0.0.1:{port}"):
            TCPStore("127.0.0.1", port, is_master=True)


def test_no_server_raises_after_the_timeout() -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]  # a port nobody listens on once closed
    start = time.monotonic()
    with pytest.raises(StoreTimeoutError, match=f"could not connect to the store at 127.0.0.1:{port}"):
        TCPStore("127.0.0.1", port, timeout=timedelta(seconds=0.3))
    assert 0.25 <= time.monotonic() - start < 5


def test_multi_tenant_masters_share_one_server() -> None:
    first = TCPStore("127.0.0.1", 0, is_master=True, multi_tenant=True)
    second = TCPStore("127.0.0.1", first.port, is_master=True, multi_tenant=True)
    first.set("k", "shared")
    assert second.get("k") == b"shared"
    first.close()
    assert second.get("k") == b"shared"  # the server outlives its first tenant
    second.close()


def test_a_client_whose_server_stopped_fails_at_once_saying_so() -> None:
    """A refusal from a server that served this client before is a stopped server: StoreLostError at once,
    not reconnecting until the store's timeout (a refusal before the first connection is still retried)."""
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30))
    client = TCPStore("127.0.0.1", master.port, timeout=timedelta(seconds=30))
    try:
        client.set("k", "v")
        assert client.get("k") == b"v"
        master.close()  # its server stops: the port now refuses connections
        start = time.monotonic()
        with pytest.raises(StoreLostError, match=rf"the store at 127\.0\.0\.1:{master.port} is gone: it served this "
                                                 r"client before and now refuses connections"):
            client.get("k")
        assert time.monotonic() - start < 5.0
    finally:
        client.close()

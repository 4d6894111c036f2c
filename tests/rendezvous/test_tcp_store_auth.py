"""TCPStore authentication: only clients that know the job's secret are served."""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
from datetime import timedelta
from typing import Iterator

import msgpack
import pytest

from asyncdist.errors import InvalidArgumentError, StoreError
from asyncdist.launcher.args import build_parser, config_from_args
from asyncdist.launcher.job import Job
from asyncdist.rendezvous import tcp_server
from asyncdist.rendezvous.tcp_protocol import (
    MAX_AUTH_FRAME_BYTES,
    NONCE_BYTES,
    OP_AUTH,
    OP_CHALLENGE,
    OP_SET,
    STATUS_DENIED,
    STATUS_OK,
    auth_proof,
    decode_response,
    encode_frame,
)
from asyncdist.rendezvous.tcp_store import TCPStore
from asyncdist.testing import spawn

SECRET = "s3cret-of-the-job"
TIMEOUT = timedelta(seconds=5)


@pytest.fixture(autouse=True)
def no_secret_in_environment(monkeypatch) -> None:
    monkeypatch.delenv("ASYNCDIST_SECRET", raising=False)


@pytest.fixture
def master() -> Iterator[TCPStore]:
    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=TIMEOUT, wait_for_workers=False, secret=SECRET)
    yield store
    store.close()


def _raw(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def _reply(sock: socket.socket) -> tuple[int, object]:
    (n,) = struct.unpack(">I", _read(sock, 4))
    return decode_response(_read(sock, n))


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def _closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _refusals(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "asyncdist.store" and "refused" in r.getMessage()]


def test_clients_with_the_secret_are_served(master) -> None:
    client = TCPStore("127.0.0.1", master.port, timeout=TIMEOUT, secret=SECRET.encode())  # bytes or str alike
    try:
        client.set("k", "v")
        assert master.get("k") == b"v"
        assert client.add("n", 2) == 2
    finally:
        client.close()


def test_the_secret_comes_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("ASYNCDIST_SECRET", SECRET)
    server = TCPStore("127.0.0.1", 0, is_master=True, timeout=TIMEOUT, wait_for_workers=False)
    try:
        client = TCPStore("127.0.0.1", server.port, timeout=TIMEOUT)
        client.set("k", "v")
        client.close()
        monkeypatch.delenv("ASYNCDIST_SECRET")
        with pytest.raises(StoreError, match="refused the request"):
            TCPStore("127.0.0.1", server.port, timeout=TIMEOUT)
        # "" turns authentication off even when the variable is set.
        monkeypatch.setenv("ASYNCDIST_SECRET", SECRET)
        with pytest.raises(StoreError, match="refused the request"):
            TCPStore("127.0.0.1", server.port, timeout=TIMEOUT, secret="")
    finally:
        server.close()


def test_a_client_without_the_secret_is_refused_and_logged(master, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="asyncdist.store"):
        with pytest.raises(StoreError, match=r"refused the request: join before authenticating"):
            TCPStore("127.0.0.1", master.port, timeout=TIMEOUT)
        assert _refusals(caplog)  # logged before the refusal was sent
    master.set("still", "serving")
    assert master.get("still") == b"serving"


def test_a_client_with_a_wrong_secret_is_refused_and_logged(master, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="asyncdist.store"):
        with pytest.raises(StoreError, match="refused this client: wrong secret"):
            TCPStore("127.0.0.1", master.port, timeout=TIMEOUT, secret="guess")
        assert any("wrong secret" in m for m in _refusals(caplog))
    assert master.check([]) is True


def test_a_client_with_a_secret_refuses_a_store_without_one() -> None:
    plain = TCPStore("127.0.0.1", 0, is_master=True, timeout=TIMEOUT, wait_for_workers=False)
    try:
        with pytest.raises(StoreError, match="does not authenticate its clients"):
            TCPStore("127.0.0.1", plain.port, timeout=TIMEOUT, secret=SECRET)
    finally:
        plain.close()


def test_an_unauthenticated_request_is_not_served(master, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="asyncdist.store"), _raw(master.port) as raw:
        raw.sendall(encode_frame([OP_SET, "intruder", b"x"]))
        status, reason = _reply(raw)
        assert status == STATUS_DENIED and "before authenticating" in reason
        assert _closed_by_peer(raw)
    assert not master.check(["intruder"])
    assert _refusals(caplog)  # logged before the refusal was sent


def test_authentication_needs_a_fresh_challenge(master) -> None:
    # Without a challenge first.
    with _raw(master.port) as raw:
        raw.sendall(encode_frame([OP_AUTH, b"n" * NONCE_BYTES, b"p" * 32]))
        assert _reply(raw)[0] == STATUS_DENIED
    # A proof recorded on one connection is useless on the next (a new nonce).
    client_nonce = b"c" * NONCE_BYTES
    with _raw(master.port) as raw:
        raw.sendall(encode_frame([OP_CHALLENGE]))
        status, nonce = _reply(raw)
        assert status == STATUS_OK and len(nonce) == NONCE_BYTES
        proof = auth_proof(SECRET.encode(), "client", nonce, client_nonce)
        raw.sendall(encode_frame([OP_AUTH, client_nonce, proof]))
        status, server_proof = _reply(raw)
        assert status == STATUS_OK and server_proof == auth_proof(SECRET.encode(), "server", nonce, client_nonce)
        raw.sendall(encode_frame([OP_SET, "mine", b"1"]))
        assert _reply(raw) == (STATUS_OK, None)
    with _raw(master.port) as replay:
        replay.sendall(encode_frame([OP_CHALLENGE]))
        _reply(replay)
        replay.sendall(encode_frame([OP_AUTH, client_nonce, proof]))
        assert _reply(replay)[0] == STATUS_DENIED


def test_a_large_frame_before_authenticating_is_refused(master, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="asyncdist.store"), _raw(master.port) as raw:
        raw.sendall(struct.pack(">I", MAX_AUTH_FRAME_BYTES + 1))
        assert _closed_by_peer(raw)
    assert any("limit" in r.getMessage() for r in caplog.records)  # logged before closing
    master.set("k", "v")  # the server carries on


def test_a_connection_that_never_authenticates_is_closed(monkeypatch, caplog) -> None:
    monkeypatch.setattr(tcp_server, "AUTH_SECONDS", 0.2)
    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=TIMEOUT, wait_for_workers=False, secret=SECRET)
    try:
        with caplog.at_level(logging.WARNING, logger="asyncdist.store"), _raw(store.port) as idle:
            start = time.monotonic()
            assert _closed_by_peer(idle)
            assert time.monotonic() - start < 4
        assert any("did not authenticate" in r.getMessage() for r in caplog.records)
    finally:
        store.close()


def test_a_store_that_cannot_prove_the_secret_is_refused() -> None:
    """A stranger posing as the store (it answers the challenge, but cannot
    know the proof) gets nothing from a client: the client stops before any request."""
    listener = socket.create_server(("127.0.0.1", 0))
    seen: list[object] = []

    def impostor() -> None:
        conn, _ = listener.accept()
        with conn:
            n = struct.unpack(">I", _read(conn, 4))[0]
            seen.append(msgpack.unpackb(_read(conn, n)))
            conn.sendall(encode_frame([STATUS_OK, b"n" * NONCE_BYTES]))
            n = struct.unpack(">I", _read(conn, 4))[0]
            seen.append(msgpack.unpackb(_read(conn, n))[0])
            conn.sendall(encode_frame([STATUS_OK, b"\0" * 32]))
            seen.append(conn.recv(100))  # what the client sends next: nothing

    thread = threading.Thread(target=impostor)
    thread.start()
    try:
        with pytest.raises(StoreError, match="failed to prove that it knows the secret"):
            TCPStore("127.0.0.1", listener.getsockname()[1], timeout=TIMEOUT, secret=SECRET)
    finally:
        thread.join(10)
        listener.close()
    assert seen == [[OP_CHALLENGE], OP_AUTH, b""]


def test_multi_tenant_masters_must_share_the_secret() -> None:
    first = TCPStore("127.0.0.1", 0, is_master=True, multi_tenant=True, wait_for_workers=False, secret=SECRET)
    try:
        with pytest.raises(InvalidArgumentError, match="another secret"):
            TCPStore("127.0.0.1", first.port, is_master=True, multi_tenant=True, secret="other")
        second = TCPStore("127.0.0.1", first.port, is_master=True, multi_tenant=True, secret=SECRET)
        second.set("k", "v")
        assert first.get("k") == b"v"
        second.close()
    finally:
        first.close()


def test_a_bad_secret_type_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="secret must be"):
        TCPStore("127.0.0.1", 0, is_master=True, secret=42)  # type: ignore[arg-type]


def test_the_launcher_serves_its_store_with_the_workers_secret() -> None:
    config = config_from_args(build_parser().parse_args(["--standalone", "--nproc-per-node", "1", "train.py"]))
    job = Job(config, environ={})
    try:
        env = job.worker_env(0, 0)
        secret = env["ASYNCDIST_SECRET"]
        # asyncdist's store: at MASTER_PORT, or beside torch's there when torch is installed.
        port = int(env.get("ASYNCDIST_STORE_ADDR", f":{job.port}").rpartition(":")[2])
        with pytest.raises(StoreError, match="refused"):
            TCPStore("127.0.0.1", port, timeout=TIMEOUT, secret="")
        worker = TCPStore("127.0.0.1", port, timeout=TIMEOUT, secret=secret)
        worker.set("k", "v")
        worker.close()
    finally:
        job.close()


def _try_the_store_without_the_secret() -> str:
    import os

    try:
        TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), timeout=TIMEOUT, secret="")
    except StoreError as exc:
        return str(exc)
    return "served"


def test_spawn_serves_its_store_with_the_ranks_secret() -> None:
    (message,) = spawn(1, _try_the_store_without_the_secret)
    assert "refused" in message

"""A stranger against a job started as the README shows: by hand, ``env://``,
no ``ASYNCDIST_SECRET``, every rank on this host.

The stranger can reach the store's port (it is a local process); it does not
know the job's secret, nor this user's key (another user could not read it).
It must learn nothing from the store, change nothing in it, and hold no
connection past the authentication deadline; the job carries on.
"""

from __future__ import annotations

import os
import socket
import stat
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asyncdist.errors import StoreError
from asyncdist.rendezvous.local_key import local_key_path
from asyncdist.rendezvous.tcp_protocol import OP_GET, OP_SET, STATUS_DENIED, decode_response, encode_frame
from asyncdist.rendezvous.tcp_store import TCPStore

ROOT = Path(__file__).resolve().parents[2]

# The README's first script, with a pause (until stdin closes) for the stranger.
SCRIPT = """
import sys
import numpy as np
import asyncdist as dist

dist.init_process_group()
x = np.full(3, float(dist.get_rank()))
dist.all_reduce(x)
assert x.tolist() == [1.0, 1.0, 1.0]
print("ready", flush=True)
sys.stdin.read()
dist.all_reduce(x)
assert x.tolist() == [2.0, 2.0, 2.0]
dist.destroy_process_group()
print("done", flush=True)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _reply(sock: socket.socket) -> tuple[int, object] | None:
    """The store's reply, or None when it closed the connection instead."""
    data = b""
    try:
        while len(data) < 4 or len(data) < 4 + struct.unpack(">I", data[:4])[0]:
            chunk = sock.recv(4096)
            if not chunk:
                return None
            data += chunk
    except ConnectionResetError:
        return None
    return decode_response(data[4:])


def _closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


@pytest.fixture
def readme_job(tmp_path: Path):
    """Two ranks started by hand, as the README shows: the store's port, once both are ready."""
    script = tmp_path / "first.py"
    script.write_text(SCRIPT)
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASYNCDIST_", "TORCHELASTIC_"))}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2",
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    ranks = [subprocess.Popen([sys.executable, str(script)], env={**env, "RANK": str(r)}, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    try:
        for rank in ranks:
            line = rank.stdout.readline()
            assert line == "ready\n", rank.stderr.read() if rank.poll() is not None else line
        yield port, ranks
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
            rank.wait(timeout=30)
            for pipe in (rank.stdin, rank.stdout, rank.stderr):
                pipe.close()


def test_a_stranger_cannot_read_or_change_a_readme_job_s_store(readme_job) -> None:
    port, ranks = readme_job
    # A client without a secret is refused before it is served anything.
    with pytest.raises(StoreError, match="refused"):
        TCPStore("127.0.0.1", port, timeout=5, secret="").get("asyncdist/0/secret")
    # So is every request on a raw connection: reading the secret, setting the abort key.
    for request in ([OP_GET, "asyncdist/0/secret", 1.0], [OP_SET, "asyncdist/0/abort", b"stranger was here"]):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(encode_frame(request))
            reply = _reply(sock)
            assert reply is not None and reply[0] == STATUS_DENIED, reply
            assert _closed_by_peer(sock)
    # A frame of a MiB before authenticating is refused from its header alone.
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(struct.pack(">I", 2**20) + b"x" * 512)
        assert _closed_by_peer(sock)
    # A silent connection is dropped at the authentication deadline (5 s).
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        start = time.monotonic()
        assert _closed_by_peer(sock)
        assert time.monotonic() - start < 12
    # The job carries on, and the key that authenticated it is this user's alone.
    for rank in ranks:
        rank.stdin.close()
    for rank in ranks:
        assert rank.stdout.readline() == "done\n", rank.stderr.read()
        assert rank.wait(timeout=30) == 0
    for path, mode in ((local_key_path(), 0o600), (os.path.dirname(local_key_path()), 0o700)):
        st = os.stat(path)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (os.getuid(), mode), path


def test_a_rank_that_finds_another_run_on_its_port_says_so(readme_job, tmp_path: Path) -> None:
    port, ranks = readme_job
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASYNCDIST_", "TORCHELASTIC_"))}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    late = subprocess.run([sys.executable, "-c", "import asyncdist as dist; dist.init_process_group()"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert late.returncode != 0
    assert "a job is already running at" in late.stderr and "stale process of an earlier run" in late.stderr, late.stderr
    assert "duplicate RANK" not in late.stderr
    for rank in ranks:  # the earlier job is left alone
        rank.stdin.close()
    for rank in ranks:
        assert rank.stdout.readline() == "done\n", rank.stderr.read()

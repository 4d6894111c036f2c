"""Same-host payloads by cross-memory attach: one copy, no socket.

Two ranks on one machine still talk over a loopback socket, where every
payload byte is copied twice (sender into the kernel, kernel into the
receiver) and pushed through the TCP stack by both processes. With Linux's
cross-memory attach (``process_vm_readv``, what MPI's shared-memory
transports use for large messages) the receiver copies the payload straight
from the sender's buffer into its own, in one system call; the sender spends
no CPU on it at all. The socket still carries the header and, back, a DONE
frame that tells the sender its buffer may be reused (see
:mod:`asyncdist.wire.frames`, ``Kind.REMOTE``).

Whether a peer's memory can be read is not guessed from host names: during
the handshake, once the other side has proven the job secret, each rank
shows its pid and the address and contents of a small random *probe* buffer
(covered by a MAC), and the peer tries to read it. A stranger never sees
them. Different hosts, PID namespaces, users, seccomp or Yama rules all
make the probe fail, and that pair keeps plain TCP.

Settings (environment):

* ``ASYNCDIST_CMA=0`` turns the transport off (default on where the system
  call exists).
* ``ASYNCDIST_CMA_MIN_BYTES``: payloads from this size go by memory
  (default 512 KiB); smaller ones are cheaper inline on the socket. A
  payload by memory costs a REMOTE header and a DONE back, about 0.1 ms of
  Python at both ends, which saves the second copy only from about this
  size here (2 ranks, 64-256 KiB: 10-45 % faster inline than by memory).
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from .. import settings
from ..buffers.scratch import pool
from ..errors import PeerLostError, ProtocolError
from ..wire.handshake import PROBE_BYTES, MemoryToken, PeerMemoryReader, valid_token

__all__ = [
    "PeerMemory",
    "SAME_HOST",
    "enabled",
    "min_bytes",
    "local_token",
    "probe_peer",
    "address_of",
    "read_payload",
    "fold_payload",
    "FOLD_PIECE_BYTES",
    "SPLIT_READ_BYTES",
]

#: Bytes of a folded payload read at a time: what a core's cache holds (8 MiB
#: read and added in 1 MiB pieces: 2.9 ms; read into a buffer of its own
#: first, then added: 3.5 ms).
FOLD_PIECE_BYTES = 1 << 20


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _bind_process_vm_readv():
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).process_vm_readv
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_ssize_t
    pointer = ctypes.POINTER(_IoVec)
    function.argtypes = [ctypes.c_int, pointer, ctypes.c_ulong, pointer, ctypes.c_ulong, ctypes.c_ulong]
    return function


_process_vm_readv = _bind_process_vm_readv()
#: Reads from this size are split across two threads (see PeerMemory.read_into).
SPLIT_READ_BYTES = 4 << 20
_reader: tuple[int, ThreadPoolExecutor] | None = None  # (pid, executor)
_reader_lock = threading.Lock()


def _reader_thread() -> ThreadPoolExecutor:
    """The process's second reader thread, started on first use (and anew in
    a forked child, which inherits the executor but not its thread)."""
    global _reader
    with _reader_lock:
        if _reader is None or _reader[0] != os.getpid():
            _reader = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="asyncdist-cma"))
        return _reader[1]
# This process's probe: random bytes at a fixed address, for peers to read.
_probe = ctypes.create_string_buffer(os.urandom(PROBE_BYTES), PROBE_BYTES)

def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process offers and uses cross-memory reads (``ASYNCDIST_CMA``, or ``environ``'s)."""
    return _process_vm_readv is not None and _settings(environ).cma


def min_bytes(environ: Mapping[str, str] | None = None) -> int:
    """The smallest payload sent by memory rather than inline (``ASYNCDIST_CMA_MIN_BYTES``, or ``environ``'s)."""
    return max(_settings(environ).cma_min_bytes, 1)


def _settings(environ: Mapping[str, str] | None) -> settings.Settings:
    return settings.current() if environ is None else settings.Settings.from_environ(environ)


def local_token() -> MemoryToken | None:
    """This process's probe for the handshake (None: the transport is off)."""
    if not enabled():
        return None
    return {"pid": os.getpid(), "addr": ctypes.addressof(_probe), "probe": _probe.raw}


def address_of(view: memoryview) -> int:
    """The address of the first byte of a contiguous, non-empty ``view``."""
    return np.frombuffer(view, dtype=np.uint8).__array_interface__["data"][0]


@dataclass(frozen=True, slots=True)
class PeerMemory:
    """Read access to one peer process's memory.

    Attributes:
        pid: the peer's process id, as this process sees it.
    """

    pid: int

    def read_into(self, dest: memoryview, addr: int) -> None:
        """Copy ``dest.nbytes`` bytes at the peer's ``addr`` into ``dest``.

        A large payload is read by two threads, half each: the system call
        releases the GIL, and while one rank reads, the sender (waiting for
        its DONE) leaves a core idle. Measured here: 64 MiB in 9.5 ms
        instead of 14.2 ms.

        Raises:
            OSError: the memory cannot be read (the peer exited, or the
                address is not mapped there).
        """
        if dest.nbytes < SPLIT_READ_BYTES:
            self._read(dest, addr)
            return
        half = dest.nbytes // 2
        other_half = _reader_thread().submit(self._read, dest[half:], addr + half)
        try:
            self._read(dest[:half], addr)
        finally:
            other_half.result()

    def _read(self, dest: memoryview, addr: int) -> None:
        assert _process_vm_readv is not None
        total = dest.nbytes
        base = address_of(dest)
        done = 0
        while done < total:
            local = _IoVec(base + done, total - done)
            remote = _IoVec(addr + done, total - done)
            count = _process_vm_readv(self.pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
            if count <= 0:
                code = ctypes.get_errno() if count < 0 else 0
                raise OSError(code, f"cannot read {total - done} bytes of process {self.pid}: {os.strerror(code)}")
            done += count


def probe_peer(token: MemoryToken | None) -> PeerMemory | None:
    """Try to read a peer's probe; return how to read its memory, or None."""
    if token is None or not enabled() or not valid_token(token):
        return None
    memory = PeerMemory(token["pid"])
    seen = bytearray(PROBE_BYTES)
    try:
        memory.read_into(memoryview(seen), token["addr"])
    except OSError:
        return None
    return memory if bytes(seen) == token["probe"] else None


def read_payload(memory: PeerMemoryReader | None, peer: int, dest: memoryview, addr: int) -> None:
    """Copy rank ``peer``'s payload at ``addr`` in its memory into ``dest``.

    Raises:
        PeerLostError: the peer's process ended while its payload was read
            (a sender killed while it waited for this read).
        ProtocolError: this process cannot read the peer's memory (None), or
            the peer named memory it does not have.
    """
    if memory is None:
        raise ProtocolError(f"rank {peer} sent a payload by memory, which this rank cannot read")
    try:
        memory.read_into(dest, addr)
    except OSError as exc:
        if exc.errno == errno.ESRCH:  # no such process, or one that has released its memory
            raise PeerLostError(f"rank {peer}'s process ended while its payload was read from its memory", peer) from exc
        raise ProtocolError(f"cannot read rank {peer}'s payload from its memory: {exc}") from exc


def fold_payload(
    memory: PeerMemoryReader | None, peer: int, fold: Callable[[Any, int], None], nbytes: int, addr: int
) -> None:
    """Read rank ``peer``'s payload at ``addr`` in pieces of :data:`FOLD_PIECE_BYTES`,
    each into one reused buffer small enough to stay in cache, and hand each to
    ``fold(piece, offset)`` at once.

    Raises:
        PeerLostError, ProtocolError: as for :func:`read_payload`.
    """
    block = pool.take_bytes(min(nbytes, FOLD_PIECE_BYTES))
    try:
        for offset in range(0, nbytes, FOLD_PIECE_BYTES):
            piece = block[: min(FOLD_PIECE_BYTES, nbytes - offset)]
            read_payload(memory, peer, piece.data, addr + offset)
            fold(piece, offset)
    finally:
        pool.give_back(block)


class _CrossMemoryAttach:
    """This transport as the handshake's :class:`~asyncdist.wire.handshake.SameHostMemory`."""

    def local_token(self) -> MemoryToken | None:
        return local_token()

    def probe(self, token: MemoryToken) -> PeerMemory | None:
        return probe_peer(token)


#: What :mod:`asyncdist.transport.connect` hands the handshake.
SAME_HOST = _CrossMemoryAttach()

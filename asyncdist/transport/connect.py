"""Opening connections: listen, dial, and run the handshake over a socket.

This module does the I/O of the handshake whose logic lives in
:mod:`asyncdist.wire.handshake`. It hands back sockets that passed it; the engine
wraps them in :class:`~asyncdist.transport.stream.Connection`.

A connection that fails the handshake is answered with a REJECT (where the
peer got far enough to read one), closed and logged; it never raises into
the accept loop, so a stranger on the port cannot take a rank down.

:func:`raise_open_files_limit` lifts the process's soft ``RLIMIT_NOFILE``
toward the hard limit the first time a rank listens: the usual soft limit
(1,024) is a relic of ``select()``, which asyncio does not use, and a rank of
a large job holds a socket per peer plus the store's, the launcher's and the
user's own descriptors.
"""

from __future__ import annotations

import asyncio
import logging
import socket

from .._refusals import RefusalLog
from ..errors import FrameTooLargeError, HandshakeError, PeerLostError, ProtocolError
from ..wire.handshake import Acceptor, Dialer, Identity, PeerAccess, message_length, reject_message
from ..wire.frames import PREFIX
from .cma import SAME_HOST

__all__ = ["open_listener", "dial", "accept_handshake", "tune_socket", "describe_peer",
           "raise_open_files_limit", "OPEN_FILES_TARGET"]

log = logging.getLogger("asyncdist.transport")

#: The soft RLIMIT_NOFILE a rank asks for (or the hard limit, if lower). Enough
#: for a socket to each of thousands of peers; not the hard limit itself, which
#: can be a million or unlimited, so that tools that walk every possible
#: descriptor stay fast.
OPEN_FILES_TARGET = 65536
_raised_limit = False


def raise_open_files_limit() -> None:
    """Raise the soft ``RLIMIT_NOFILE`` toward the hard limit, once per process,
    and log the value (INFO). Never lowers it; a failure is logged, not raised."""
    global _raised_limit
    if _raised_limit:
        return
    _raised_limit = True
    try:
        import resource
    except ImportError:  # not POSIX
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = OPEN_FILES_TARGET if hard == resource.RLIM_INFINITY else min(hard, OPEN_FILES_TARGET)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError) as exc:
            log.warning("cannot raise the open-files limit (RLIMIT_NOFILE) from %d to %d: %s", soft, target, exc)
            return
        log.info("raised the open-files limit (soft RLIMIT_NOFILE) from %d to %d (hard limit %s)", soft, target,
                 "unlimited" if hard == resource.RLIM_INFINITY else hard)
    else:
        log.info("open-files limit (soft RLIMIT_NOFILE): %s", "unlimited" if soft == resource.RLIM_INFINITY else soft)


def tune_socket(sock: socket.socket) -> None:
    """Set the options every peer stream uses: no Nagle delay, non-blocking."""
    sock.setblocking(False)
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def open_listener(host: str, backlog: int = 128) -> socket.socket:
    """Bind an ephemeral port on ``host`` and listen (non-blocking).

    Raises:
        OSError: the address cannot be bound.
    """
    infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


async def _read_exact(loop: asyncio.AbstractEventLoop, sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = await loop.sock_recv_into(sock, view[got:])
        if k == 0:
            raise ConnectionResetError("connection closed during the handshake")
        got += k
    return bytes(buf)


async def _read_message(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> bytes:
    length = message_length(await _read_exact(loop, sock, PREFIX.size))
    return await _read_exact(loop, sock, length)


async def dial(
    loop: asyncio.AbstractEventLoop,
    host: str,
    port: int,
    me: Identity,
    peer: int,
) -> tuple[socket.socket, PeerAccess]:
    """Connect to ``peer`` at host:port and authenticate both ways; return the
    socket and what the handshake learned about reading each other's memory.

    Raises:
        PeerLostError: the peer cannot be reached or closed the connection.
        HandshakeError: the peer is not a rank of this job, or refused us.
    """
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise PeerLostError(f"cannot resolve rank {peer}'s address {host}:{port}: {exc}", peer) from exc
    try:
        tune_socket(sock)
        await loop.sock_connect(sock, address)
        handshake = Dialer(me, peer, memory=SAME_HOST)
        await loop.sock_sendall(sock, handshake.hello())
        await loop.sock_sendall(sock, handshake.on_challenge(await _read_message(loop, sock)))
        await loop.sock_sendall(sock, handshake.on_verdict(await _read_message(loop, sock)))
    except OSError as exc:
        sock.close()
        raise PeerLostError(f"cannot connect to rank {peer} at {host}:{port}: {exc}", peer) from exc
    except BaseException:
        sock.close()
        raise
    return sock, handshake


async def accept_handshake(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, me: Identity, refusals: RefusalLog | None = None
) -> tuple[int, PeerAccess] | None:
    """Authenticate an accepted connection; return the peer's rank and memory
    access, or None.

    On failure the connection is closed and the reason logged (through
    ``refusals``, rate-limited, when given); nothing is raised.
    """
    note = refusals.note if refusals is not None else _log_in_full
    tune_socket(sock)
    handshake = Acceptor(me, memory=SAME_HOST)
    try:
        await loop.sock_sendall(sock, handshake.on_hello(await _read_message(loop, sock)))
        await loop.sock_sendall(sock, handshake.on_auth(await _read_message(loop, sock)))
        handshake.on_reads(await _read_message(loop, sock))
        return handshake.peer_rank, handshake
    except (HandshakeError, FrameTooLargeError, ProtocolError) as exc:
        note("refused", "rank %d refused a connection from %s: %s", me.rank, describe_peer(sock), exc)
        try:
            sock.send(reject_message(str(exc)))
        except OSError:
            pass
    except OSError as exc:
        note("failed", "rank %d: a connection from %s failed during the handshake: %s", me.rank, describe_peer(sock), exc)
    sock.close()
    return None


def _log_in_full(kind: str, msg: str, *args: object) -> None:
    log.warning(msg, *args)


def describe_peer(sock: socket.socket) -> str:
    """``host:port`` of the socket's peer, for logs."""
    try:
        host, port = sock.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "an unknown address"

"""Listening for the TCP store, and servers shared by the masters of one process.

:func:`open_server` binds the port (or adopts a listening socket) and starts
a :class:`~.tcp_server.StoreServer` on it, or, for a ``multi_tenant``
master, shares the one already serving that port (as torch does);
:func:`release_server` drops one tenant and stops the server with the last.
"""

from __future__ import annotations

import socket
import threading

from ..errors import InvalidArgumentError, StoreError
from .tcp_server import StoreServer

__all__ = ["open_server", "release_server"]


def _listen(host: str, port: int, listen_fd: int | None) -> socket.socket:
    """Bind and listen on one socket (one port even for names with several addresses),
    or adopt the listening socket ``listen_fd``."""
    try:
        if listen_fd is not None:
            return socket.socket(fileno=listen_fd)
        family, kind, proto, _, addr = socket.getaddrinfo(
            host or "0.0.0.0", port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
            sock.listen(1024)
        except BaseException:
            sock.close()
            raise
    except OSError as exc:
        raise StoreError(f"TCPStore: cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    return sock


# Servers shared by multi_tenant masters of this process, by port.
_TENANTS: dict[int, StoreServer] = {}
_TENANTS_LOCK = threading.Lock()


def open_server(host: str, port: int, listen_fd: int | None, multi_tenant: bool,
                secret: bytes | None = None) -> StoreServer:
    """Start a server on ``host:port`` (or on ``listen_fd``), or share one (any thread).

    A ``multi_tenant`` caller gets the running multi-tenant server of ``port`` when
    there is one, and becomes one more of its tenants. Pair each call with one
    :func:`release_server`. With a ``secret``, clients must authenticate.

    Raises:
        StoreError: cannot listen on ``host:port``.
        InvalidArgumentError: the shared server of ``port`` has another secret.
    """
    with _TENANTS_LOCK:
        server = _TENANTS.get(port) if multi_tenant else None
        if server is not None:
            if server.secret != secret:
                raise InvalidArgumentError(f"TCPStore: the multi_tenant store on port {port} was started "
                                           "with another secret")
            server.tenants += 1
            return server
        server = StoreServer(_listen(host, port, listen_fd), secret)
        if multi_tenant:
            _TENANTS[server.port] = server
        return server


def release_server(server: StoreServer) -> None:
    """Drop one tenant of ``server``; the last one stops it (any thread)."""
    with _TENANTS_LOCK:
        server.tenants -= 1
        if server.tenants > 0:
            return
        if _TENANTS.get(server.port) is server:
            del _TENANTS[server.port]
    server.stop()

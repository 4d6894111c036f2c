"""The streams between the ranks of a job: listening, accepting, dialing.

A :class:`Mesh` owns one rank's listening socket and its accept loop, and
dials the lower ranks: the higher rank of each pair dials the lower one, so
each pair has exactly one stream. Every socket that passes the handshake
(:mod:`.connect`) is handed to the ``attach`` callback, which wraps it in a
:class:`~asyncdist.transport.stream.Connection`; a stranger, or a rank that
fails authentication, is refused in the handshake and never reaches it. So is
a second connection from a rank (``wanted`` says which ranks may still dial in).

The port is open to anyone who can reach the host, so the accept loop is
built to survive a flood of connections that never authenticate:

* at most :data:`MAX_PENDING_HANDSHAKES` connections may be in the handshake
  at once; the next one closes the oldest (a rank of the job finishes its
  handshake in milliseconds, so the oldest is the likeliest stranger);
* each has :data:`~asyncdist.wire.handshake.HANDSHAKE_SECONDS` to finish;
* when ``accept`` fails for want of file descriptors (``EMFILE``/``ENFILE``),
  the loop closes the oldest pending handshake and waits before trying again,
  :data:`ACCEPT_BACKOFF_SECONDS` doubling up to :data:`ACCEPT_BACKOFF_MAX_SECONDS`,
  instead of spinning on a listener that stays readable;
* refusals are logged through one :class:`~asyncdist._refusals.RefusalLog`
  (a few lines in full, then a summary every 10 s);
* the first listener of the process raises the soft ``RLIMIT_NOFILE`` toward
  the hard limit (:func:`raise_open_files_limit`), as servers do.

It must not know frames, matching or what happens to a lost peer.
Loop thread only.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import logging
import socket
from typing import Callable

from .._refusals import RefusalLog
from ..errors import PeerLostError
from ..wire.handshake import HANDSHAKE_SECONDS, Identity, PeerAccess
from . import injection
from .connect import accept_handshake, describe_peer, dial, open_listener, raise_open_files_limit

__all__ = ["Mesh", "MAX_PENDING_HANDSHAKES", "ACCEPT_BACKOFF_SECONDS", "ACCEPT_BACKOFF_MAX_SECONDS"]

log = logging.getLogger("asyncdist.engine.engine")

#: Connections that may be in the handshake at once, per listener. A job's
#: ranks dial in once each, at init, and finish in milliseconds; 64 is room
#: for a world of hundreds dialing at the same moment, and bounds what a
#: flood of strangers holds (64 sockets, 64 small tasks).
MAX_PENDING_HANDSHAKES = 64
#: First wait after an accept that failed for want of descriptors (doubles).
ACCEPT_BACKOFF_SECONDS = 0.01
#: Longest wait between accepts while descriptors are short: well under the
#: heartbeat interval, so the rank keeps talking to its peers meanwhile.
ACCEPT_BACKOFF_MAX_SECONDS = 1.0
# accept() errors that mean "no descriptors (or kernel memory) now": retrying
# at once fails the same way, since the connection stays in the backlog.
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# Connections accepted per wake-up of the listener before the loop serves
# others (asyncio's servers take the backlog's size; a flood is then one
# batch among the loop's other work, not a stall).
_ACCEPTS_PER_WAKEUP = 32


class Mesh:
    """Listens for, accepts and dials one rank's peers.

    Args:
        me: this rank's identity (job id, rank, world size, secret).
        handshake_timeout: seconds an incoming connection may take to
            authenticate before it is dropped.
        attach: called with ``(peer, socket, access)`` for each authenticated
            stream (``access``: whether the two may read each other's memory).
        wanted: whether ``peer`` (a higher rank) may still dial in.
    """

    def __init__(
        self,
        me: Identity,
        *,
        handshake_timeout: float = HANDSHAKE_SECONDS,
        attach: Callable[[int, socket.socket, PeerAccess], None],
        wanted: Callable[[int], bool],
    ) -> None:
        self.me = me
        self.handshake_timeout = handshake_timeout
        self._attach = attach
        self._wanted = wanted
        self._listener: socket.socket | None = None
        self._tasks: set[asyncio.Task] = set()
        # Handshakes in progress, oldest first (the task and its socket).
        self._pending: collections.OrderedDict[asyncio.Task, socket.socket] = collections.OrderedDict()
        self._closing = False
        # On the transport's logger, with the handshake's own refusals.
        self.refusals = RefusalLog(logging.getLogger("asyncdist.transport"), f"rank {me.rank}")
        self._backoff = ACCEPT_BACKOFF_SECONDS
        self._backoff_handle: asyncio.TimerHandle | None = None
        self._accepting = False  # the listener's reader is registered

    async def listen(self, host: str, listener: socket.socket | None = None) -> tuple[str, int]:
        """Listen on an ephemeral port of ``host`` (or on ``listener``, from
        :func:`~.connect.open_listener`, bound earlier); return (host, port) to publish.

        Raises:
            OSError: the address cannot be bound.
        """
        raise_open_files_limit()
        self._listener = listener if listener is not None else open_listener(host)
        self._start_accepting()
        return host, self._listener.getsockname()[1]

    async def dial(self, peer: int, host: str, port: int) -> None:
        """Connect to ``peer`` at host:port, authenticate, and attach the stream.

        Raises:
            PeerLostError: the peer cannot be reached.
            HandshakeError: the peer is not a rank of this job, or refused us.
        """
        if injection.INJECTOR is not None and injection.INJECTOR.refused(self.me.rank, peer):  # a fault plan's
            raise PeerLostError(f"cannot connect to rank {peer} at {host}:{port}: refused (fault plan)", peer)
        self._attach(peer, *await dial(asyncio.get_running_loop(), host, port, self.me, peer))

    def _start_accepting(self) -> None:
        assert self._listener is not None
        self._backoff_handle = None
        if not self._closing:
            asyncio.get_running_loop().add_reader(self._listener.fileno(), self._on_readable)
            self._accepting = True

    def _stop_accepting(self) -> None:
        assert self._listener is not None
        asyncio.get_running_loop().remove_reader(self._listener.fileno())
        self._accepting = False

    def _on_readable(self) -> None:
        """Accept what the listener holds, a bounded batch per wake-up.

        A reader callback rather than a task awaiting ``sock_accept``: a
        cancelled ``sock_accept`` can lose a socket it had just accepted
        (uvloop 0.23), and a callback can stop reading during a back-off.
        """
        assert self._listener is not None
        for _ in range(_ACCEPTS_PER_WAKEUP):
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self.refusals.note("failed accepts", "rank %d: accept failed: %s", self.me.rank, exc)
                if exc.errno in _OUT_OF_RESOURCES:
                    # The connection stays in the backlog and the listener
                    # readable: wait (freeing a descriptor) instead of spinning.
                    self._evict_oldest()
                    self._stop_accepting()
                    self._backoff_handle = asyncio.get_running_loop().call_later(self._backoff, self._start_accepting)
                    self._backoff = min(2 * self._backoff, ACCEPT_BACKOFF_MAX_SECONDS)
                return
            self._backoff = ACCEPT_BACKOFF_SECONDS
            if len(self._pending) >= MAX_PENDING_HANDSHAKES:
                self._evict_oldest()
            task = self._spawn(self._admit(sock))
            self._pending[task] = sock

    def _evict_oldest(self) -> None:
        """Close the connection that has been in the handshake longest."""
        if not self._pending:
            return
        task, sock = self._pending.popitem(last=False)
        self.refusals.note(
            "evicted", "rank %d: closed the oldest of %d connections still in the handshake (%s), to admit more",
            self.me.rank, MAX_PENDING_HANDSHAKES, describe_peer(sock))
        task.cancel()
        # Closed once the task has let go of it (a task cancelled before it
        # started never runs its own cleanup); closing it while a read is
        # still registered could let its descriptor number be reused under it.
        task.add_done_callback(lambda _: sock.close())

    async def _admit(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        rank = self.me.rank
        task = asyncio.current_task()
        try:
            admitted = await asyncio.wait_for(
                accept_handshake(loop, sock, self.me, self.refusals), self.handshake_timeout)
        except asyncio.TimeoutError:
            self.refusals.note(
                "timed out", "rank %d: dropped a connection from %s that did not finish the handshake in time (%g s)",
                rank, describe_peer(sock), self.handshake_timeout)
            sock.close()
            return
        except asyncio.CancelledError:  # closing, or evicted
            sock.close()
            raise
        finally:
            if task is not None:  # always, in a task
                self._pending.pop(task, None)
        if admitted is None:
            return
        peer, access = admitted
        if peer < rank or self._closing or not self._wanted(peer):
            self.refusals.note("refused", "rank %d: refused an unexpected second connection from rank %d", rank, peer)
            sock.close()
            return
        self._attach(peer, sock, access)

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def close(self) -> None:
        """Stop accepting, drop handshakes in progress, close the listener."""
        self._closing = True
        if self._backoff_handle is not None:
            self._backoff_handle.cancel()
        if self._accepting:
            self._stop_accepting()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for sock in self._pending.values():  # tasks cancelled before they started
            sock.close()
        self._pending.clear()
        if self._listener is not None:
            self._listener.close()
        self.refusals.flush()


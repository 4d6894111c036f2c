"""Heartbeats: finding peers that went silent without closing their stream.

A rank that crashes, exits or is killed has its sockets closed by the
kernel, and its peers hear of it at once (end of stream, or a reset). A
rank whose host loses power, or whose network link goes down, says nothing:
its TCP stream stays open ("half-open"), and TCP itself gives up only after
many minutes of retransmissions (``net.ipv4.tcp_retries2``: about 15 min on
Linux), or never, for a stream that has nothing to send. The heartbeat
bounds that:

* every ``interval`` seconds, each connection on which nothing was sent for
  ``interval`` seconds gets a PING frame (a busy connection needs none);
* a peer from which nothing at all arrived for ``timeout`` seconds is
  declared lost, through the engine's usual path for a lost peer, with a
  :class:`~asyncdist.errors.PeerLostError` naming the rank and the silence.

The check runs every ``interval / 2`` seconds, so a peer sends something at
least every ``1.5 * interval`` seconds, and a silent peer is detected between
``timeout`` and ``timeout + interval / 2`` seconds after the last bytes it
sent. Hence the rule ``timeout >= 2 * interval``.

Configuration is read once per engine, from ``ASYNCDIST_HEARTBEAT_INTERVAL``
and ``ASYNCDIST_HEARTBEAT_TIMEOUT`` (seconds; defaults 5 and 30), unless the
caller passes a :class:`HeartbeatConfig` (``init_world(heartbeat=...)``).
An interval of 0 turns the heartbeat off; a timeout of 0 keeps the pings
(they keep idle streams open through NATs and firewalls) but declares no
peer lost. Every rank of a job should use the same settings: a rank whose
timeout is shorter than its peers' ping period declares idle peers lost.

Stall guard: the check is a task on the rank's loop. When the loop itself
was held up (a long computation in a coroutine, a stopped process), the
peers' bytes may be waiting unread in the kernel, so a tick that comes late
sends its pings but declares nobody lost; the next tick, after the readers
ran, decides.

This module knows connections (when they last sent and received), the PING
frame, and a callback for a silent peer; not matching, groups or the engine.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass
from typing import Callable, Mapping

from .. import settings
from ..errors import InvalidArgumentError, PeerLostError
from ..wire.control import Ping, encode_control
from .stream import Connection

__all__ = ["HeartbeatConfig", "Heartbeat", "INTERVAL_ENV", "TIMEOUT_ENV"]

log = logging.getLogger("asyncdist.transport")

INTERVAL_ENV = settings.name_of("heartbeat_interval")
TIMEOUT_ENV = settings.name_of("heartbeat_timeout")


@dataclass(frozen=True, slots=True)
class HeartbeatConfig:
    """How often idle streams are pinged, and how long a silent peer is trusted.

    Attributes:
        interval: seconds without sending after which a PING is sent; 0
            turns the heartbeat off.
        timeout: seconds without receiving anything after which a peer is
            declared lost; 0 sends pings but declares nobody lost. Must be at
            least ``2 * interval`` when both are on.

    Raises:
        InvalidArgumentError: a negative or non-finite value, or a timeout
            shorter than twice the interval.
    """

    interval: float = 5.0
    timeout: float = 30.0

    def __post_init__(self) -> None:
        for name in ("interval", "timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise InvalidArgumentError(f"heartbeat {name} must be a finite number of seconds >= 0, got {value!r}")
        if self.interval > 0 and 0 < self.timeout < 2 * self.interval:
            raise InvalidArgumentError(
                f"heartbeat timeout ({self.timeout:g} s) must be at least twice the interval ({self.interval:g} s), "
                "or idle peers would be declared lost"
            )

    @property
    def enabled(self) -> bool:
        """True when pings are sent (``interval > 0``)."""
        return self.interval > 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> HeartbeatConfig:
        """The settings of ``ASYNCDIST_HEARTBEAT_INTERVAL`` / ``_TIMEOUT`` (or ``environ``'s), else the defaults.

        Raises:
            InvalidArgumentError: a variable is set to something else than a
                number of seconds (ConfigurationError), or the pair breaks the rule above.
        """
        read = settings.current() if environ is None else settings.Settings.from_environ(environ)
        try:
            return cls(read.heartbeat_interval, read.heartbeat_timeout)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"{exc} (from {INTERVAL_ENV} / {TIMEOUT_ENV})") from None


class Heartbeat:
    """Pings idle connections and declares silent peers lost (loop thread only).

    Args:
        rank: this rank (the PING frames' source).
        config: the settings.
        connections: the live map of peer rank to connection (read, never changed here).
        on_silent: called with the rank and its :class:`PeerLostError` for a
            peer silent for ``config.timeout`` seconds; it must drop that
            peer from ``connections``.
    """

    def __init__(
        self,
        rank: int,
        config: HeartbeatConfig,
        connections: Mapping[int, Connection],
        on_silent: Callable[[int, PeerLostError], None],
    ) -> None:
        self.config = config
        self._connections = connections
        self._on_silent = on_silent
        self._ping = encode_control(Ping(rank))
        self._task: asyncio.Task | None = None
        self._last_tick = 0.0
        #: Loop time before which a tick declares nobody lost, as a late one: set
        #: while a test's fault plan pauses this rank in one loop (:meth:`Engine.stall
        #: <asyncdist.engine.engine.Engine.stall>`), which a stopped process's late tick is.
        self.stalled_until = 0.0

    @property
    def period(self) -> float:
        """Seconds between two checks."""
        return self.config.interval / 2

    def start(self) -> None:
        """Start the periodic task on the running loop (a no-op when disabled)."""
        if self.config.enabled and self._task is None:
            loop = asyncio.get_running_loop()
            self._last_tick = loop.time()
            self._task = loop.create_task(self._run())

    async def stop(self) -> None:
        """Stop the periodic task."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.period)
            self.beat(loop.time())

    def beat(self, now: float) -> None:
        """One check at loop time ``now``: ping idle streams, drop silent peers."""
        since = now - self._last_tick
        late = since > 2 * self.period or now < self.stalled_until
        self._last_tick = now
        interval, timeout = self.config.interval, self.config.timeout
        for rank, connection in list(self._connections.items()):
            silent = now - connection.last_received
            if timeout and silent >= timeout and not late:
                self._on_silent(rank, PeerLostError(
                    f"rank {rank} sent nothing for {silent:.1f} s (heartbeat timeout {timeout:g} s): "
                    "its process, host or network link may be down", rank))
                continue
            if now - connection.last_sent >= interval:
                try:
                    connection.send_frame(self._ping, None)
                except PeerLostError:
                    pass  # the connection reports its own loss
        if late:
            log.debug("heartbeat check %.1f s after the last one: the loop was busy; "
                      "no peer declared lost this time", since)

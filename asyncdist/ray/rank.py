"""One rank of a Ray world: the code that runs inside each Ray actor.

:class:`Rank` is a plain class; :mod:`.world` makes it an *async* Ray actor
(``ray.remote(Rank)``), so every method below runs on the actor's own asyncio
event loop. That loop is where the await API's world lives: an async function
sent by :meth:`Rank.run_async` is awaited right there, with no thread between
it and the world's sockets.

Rendezvous goes through Ray only: rank 0's actor serves a :class:`TCPStore` on
its node's address and a port the kernel picks (:meth:`Rank.serve_store`); the
driver passes the resulting ``(host, port)`` to every rank as a Ray object, so
there is no MASTER_ADDR and no fixed port. Each face (the await API, the
blocking facade) rendezvouses in the store under its own prefix, on first use.

A blocking function (:meth:`Rank.run_blocking`) must not block the actor's
loop (the await world's heartbeat runs there), so it runs on one dedicated
thread of the actor, where it may use the facade (``import asyncdist as
dist``); the facade has its own loop thread, as in any process.

After a lost rank, an async function may :func:`shrink` the rank's group
and later :func:`grow` it; both make the result the rank's group for every
later function (:meth:`Rank.adopt`), and :meth:`Rank.membership` tells the
driver the new numbering. An actor that Ray restarted (``max_restarts``) comes
back with no world; :meth:`Rank.join` joins the running job through the same
store (``init_world(..., join=True)``) while the others grow. The store lives
in rank 0's actor: a world whose rank 0 was lost can do neither.

This module imports nothing of Ray: it runs inside the actor and must not
know how it was placed or started.
"""

from __future__ import annotations

import asyncio
from contextvars import ContextVar
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any, Awaitable, Callable

from ..errors import NotInitializedError, PeerLostError
from ..facade import lifecycle
from ..group.process_group import ProcessGroup
from ..group.world import init_world
from ..rendezvous.store import PrefixStore
from ..rendezvous.store_threads import STORE_EXECUTOR
from ..rendezvous.tcp_store import TCPStore
from ..transport.heartbeat import HeartbeatConfig

__all__ = ["Rank", "grow", "shrink"]

_AWAIT_PREFIX = "await"
_FACADE_PREFIX = "facade"
_STORE_RANK = 0  # the job id of the rank whose actor serves the store

#: The rank whose actor runs the current async function (set by :meth:`Rank.run_async`).
_CURRENT: ContextVar[Rank] = ContextVar("asyncdist_ray_rank")


class Rank:
    """A rank hosted by a Ray actor (methods run on the actor's event loop).

    Args:
        rank, world_size: this rank and the number of ranks.
        secret: the job's secret, which the store and every connection check.
        timeout: seconds; bounds the rendezvous and every operation.
        heartbeat: the await world's heartbeat (None: from the environment).
        node_address: returns this node's address as the other nodes reach it
            (Ray's node IP, given by :mod:`.world`).
    """

    def __init__(self, rank: int, world_size: int, secret: str, timeout: float,
                 heartbeat: HeartbeatConfig | None, node_address: Callable[[], str]) -> None:
        self.rank = rank
        self.world_size = world_size
        self._secret = secret
        self._timeout = timeout
        self._heartbeat = heartbeat
        self._node_address = node_address
        self._store: TCPStore | None = None
        self._serving = False
        self._world: ProcessGroup | None = None
        self._facade = False
        self._joining = asyncio.Lock()  # calls run concurrently on an async actor: one join per face
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"asyncdist-ray-rank{rank}")

    async def serve_store(self) -> tuple[str, int]:
        """Serve the job's store from this actor (rank 0); returns its ``(host, port)``."""
        host = self._node_address()
        self._store = await self._in_store_thread(
            lambda: TCPStore(host, 0, self.world_size, is_master=True, timeout=self._timeout,
                             wait_for_workers=False, secret=self._secret))
        self._serving = True
        return host, self._store.port

    async def connect(self, address: tuple[str, int]) -> str:
        """Open this rank's client of the store at ``address``; returns the node's address."""
        if self._store is None:  # rank 0 serves it and is already its client
            host, port = address
            self._store = await self._in_store_thread(
                lambda: TCPStore(host, port, self.world_size, timeout=self._timeout, secret=self._secret))
        return self._node_address()

    async def run_async(self, fn: Callable[..., Awaitable[Any]], args: tuple, kwargs: dict) -> Any:
        """Await ``fn(world, *args, **kwargs)`` on this actor's loop; join the world first if needed."""
        async with self._joining:
            if self._world is None:
                self._world = await init_world(
                    store=self._require_store(), rank=self.rank, world_size=self.world_size, timeout=self._timeout,
                    store_prefix=_AWAIT_PREFIX, heartbeat=self._heartbeat, group_name="ray")
        _CURRENT.set(self)  # this call's context only: for shrink() and grow() inside fn
        return await fn(self._world, *args, **kwargs)

    async def join(self, address: tuple[str, int]) -> int:
        """Join the running job through its store at ``address`` (an actor that
        Ray restarted), once its members grow; returns this rank in the grown group."""
        await self.connect(address)
        async with self._joining:
            self.adopt(await init_world(
                store=self._require_store(), timeout=self._timeout, store_prefix=_AWAIT_PREFIX,
                heartbeat=self._heartbeat, group_name="ray", join=True))
        return self.rank

    def adopt(self, group: ProcessGroup) -> None:
        """Make ``group`` (a shrunk or grown world) this rank's group for later functions."""
        self._world = group
        self.rank, self.world_size = group.rank, group.size

    async def membership(self, settle: bool = False) -> tuple[int, tuple[int, ...], str] | None:
        """This rank in its await world, the world's job ids by rank, and this
        node's address; None before the rank has a world (a restarted actor).
        ``settle``: first let a join under way finish (the driver asks so only
        when the members already count this actor in)."""
        if settle:
            async with self._joining:
                pass
        if self._world is None:
            return None
        return self._world.rank, tuple(self._world.ranks), self._node_address()

    @property
    def group(self) -> ProcessGroup:
        """This rank's current await world (the last one adopted)."""
        if self._world is None:
            raise NotInitializedError(f"rank {self.rank} of the Ray world has not joined its await world yet")
        return self._world

    def serves_store(self) -> bool:
        """Whether this actor serves the world's store (rank 0, not restarted since)."""
        return self._serving

    async def run_blocking(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """Call ``fn(*args, **kwargs)`` on this rank's thread, after the facade's
        ``init_process_group`` on first use (so ``fn`` may use ``import asyncdist as dist``)."""
        loop = asyncio.get_running_loop()
        async with self._joining:
            if not self._facade:
                store = PrefixStore(_FACADE_PREFIX, self._require_store())
                await loop.run_in_executor(self._thread, lambda: lifecycle.init_process_group(
                    store=store, rank=self.rank, world_size=self.world_size,
                    timeout=timedelta(seconds=self._timeout)))
                self._facade = True
        return await loop.run_in_executor(self._thread, lambda: fn(*args, **kwargs))

    async def close(self) -> None:
        """Leave both faces' worlds and stop the store (rank 0 last: the others read it)."""
        loop = asyncio.get_running_loop()
        if self._world is not None:
            world, self._world = self._world, None
            await world.close()
        if self._facade:
            self._facade = False
            await loop.run_in_executor(self._thread, lifecycle.destroy_process_group)
        self._thread.shutdown(wait=False)
        if self._store is not None:
            store, self._store = self._store, None
            await self._in_store_thread(store.close)

    def _require_store(self) -> TCPStore:
        if self._store is None:
            raise NotInitializedError(f"rank {self.rank} of the Ray world has no store: connect() was not called")
        return self._store

    @staticmethod
    async def _in_store_thread(call: Callable[[], Any]) -> Any:
        # The store's client blocks; the actor's loop must not (other ranks' calls arrive on it).
        return await asyncio.get_running_loop().run_in_executor(STORE_EXECUTOR, call)


async def shrink(group: ProcessGroup, **kwargs: Any) -> ProcessGroup:
    """``group.shrink(**kwargs)`` inside a Ray rank, and make the result the
    rank's group for later functions (what the driver's ``refresh`` reports).

    Raises:
        PeerLostError: rank 0, whose actor serves the store, is lost.
    """
    rank = _current("shrink", group)
    rank.adopt(await group.shrink(**kwargs))
    return rank.group


async def grow(group: ProcessGroup, **kwargs: Any) -> ProcessGroup:
    """``group.grow(**kwargs)`` inside a Ray rank (``min_joiners=1`` waits for a
    restarted actor's :meth:`Rank.join`), and make the result the rank's group.

    Raises:
        PeerLostError: rank 0, whose actor serves the store, is lost.
    """
    rank = _current("grow", group)
    rank.adopt(await group.grow(**kwargs))
    return rank.group


def _current(what: str, group: ProcessGroup) -> Rank:
    """The Ray rank running this function, after checking that its store still lives."""
    rank = _CURRENT.get(None)
    if rank is None:
        raise NotInitializedError(f"asyncdist.ray.{what}: call it inside a function that RayWorld.run runs "
                                  f"(an async def, on a rank's actor); elsewhere, call group.{what}() itself")
    if group.ranks[0] != _STORE_RANK or 0 in group.failed_ranks():  # group rank 0 is the store's rank
        raise PeerLostError(f"asyncdist.ray.{what} on rank {group.rank}: rank 0 of the Ray world, whose actor "
                            f"serves its store, was lost; a Ray world cannot shrink or grow without it "
                            f"(keep rank 0 alive, or start a new world)", _STORE_RANK)
    return rank

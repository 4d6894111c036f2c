"""``init_world``: the entry point of the await API.

It does what ``init_process_group`` does, as a coroutine on the caller's
loop, and returns the world :class:`~asyncdist.group.process_group.ProcessGroup`
instead of hiding it in module state::

    world = await asyncdist.init_world("tcp://10.0.0.1:29500", rank=r, world_size=4)
    try:
        await world.send(x, dst=1)
    finally:
        await world.close()
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Sequence

from .. import settings
from ..timeouts import DEFAULT_TIMEOUT
from ..timeouts import as_seconds
from .process_group import ProcessGroup
from .bootstrap import ABORT_LINGER_SECONDS, bootstrap, refuse, whoami
from ..flight.dumps import install_sigusr1
from .admission import conclude
from .joining import join as join_running
from ..errors import InvalidArgumentError, RendezvousError
from ..rendezvous.init_method import resolve
from ..rendezvous.store import STORE_EXECUTOR, PrefixStore, Store
from ..transport.heartbeat import HeartbeatConfig

__all__ = ["init_world"]


async def init_world(
    init_method: str | None = None,
    *,
    rank: int = -1,
    world_size: int = -1,
    store: Store | None = None,
    timeout: timedelta | float | None = None,
    group_name: str = "",
    store_prefix: str = "asyncdist",
    heartbeat: HeartbeatConfig | None = None,
    join: bool = False,
) -> ProcessGroup:
    """Join the job and return its world group (loop thread; returns when all ranks joined).

    Args:
        init_method: ``env://`` (default), ``tcp://host:port`` or ``file:///path``.
        rank, world_size: this rank and the number of ranks (-1: from the
            environment or the URL).
        store: a store to rendezvous through instead of ``init_method``.
        timeout: a ``timedelta`` or seconds; bounds the rendezvous and becomes
            the world group's per-operation timeout (default 30 minutes).
        group_name: the world group's name, in error messages.
        store_prefix: the key prefix used in the store (distinct per
            initialisation when one store serves several).
        heartbeat: how often idle connections are pinged and how long a
            silent peer is trusted (None: ``ASYNCDIST_HEARTBEAT_INTERVAL`` /
            ``ASYNCDIST_HEARTBEAT_TIMEOUT``, default 5 s / 30 s; see
            :mod:`asyncdist.transport.heartbeat`).
        join: join a running job instead (its rendezvous address and secret,
            no rank or world size): wait until its members call
            :meth:`~asyncdist.group.process_group.ProcessGroup.grow`, and
            return the grown group, where this process has the next rank
            (see :mod:`asyncdist.group.joining`).

    Raises:
        RendezvousError: see :func:`asyncdist.rendezvous.init_method.resolve`
            and :func:`asyncdist.group.bootstrap.bootstrap`.
        InvalidRankError: ``rank`` is negative or not below ``world_size``
            (the other ranks, told through the store, raise RendezvousError).
        InvalidArgumentError: a bad heartbeat setting, or ``join`` with a rank or world size.
    """
    seconds = as_seconds(timeout, default=DEFAULT_TIMEOUT.total_seconds(), what="init_world: timeout")
    settings.refresh()  # this world's settings: what the environment says now; a bad one fails here
    if heartbeat is None:
        heartbeat = HeartbeatConfig.from_env()
    loop = asyncio.get_running_loop()
    if join:
        if rank != -1 or world_size != -1:
            raise InvalidArgumentError(f"init_world: a joining process gets its rank from the running job's grow(); "
                                       f"give no rank or world_size (got rank={rank}, world_size={world_size})")
        rank, world_size = 1, 2  # for resolve(): any rank but 0 is a client of the job's store
    plan = await loop.run_in_executor(
        STORE_EXECUTOR,
        lambda: resolve(init_method, rank=rank, world_size=world_size, store=store, timeout=seconds,
                        who=f"joining process ({whoami()})" if join else None),
    )
    if plan.refused is not None:  # an impossible rank: tell the others, who wait for a rank that never comes
        try:
            await refuse(PrefixStore(store_prefix, plan.store), f"{plan.refused} ({whoami()})")
        finally:
            await loop.run_in_executor(STORE_EXECUTOR, plan.store.close)
        raise plan.refused
    ranks: Sequence[int] = range(plan.world_size)
    contexts = None  # the engine's counter; a newcomer's group derives them as the members do
    connected = True  # a newcomer: whether it reached every process of the grow
    try:
        if join:
            engine, admission, connected = await join_running(
                PrefixStore(store_prefix, plan.store), host=plan.host, timeout=seconds, heartbeat=heartbeat,
                where=plan.where)
            ranks, group_name, contexts = admission.members, group_name or admission.name, admission.contexts()
        else:
            engine = await bootstrap(
                PrefixStore(store_prefix, plan.store), plan.rank, plan.world_size, host=plan.host, timeout=seconds,
                heartbeat=heartbeat, where=plan.where,
            )
    except BaseException as exc:
        if plan.owns_store:
            if isinstance(exc, RendezvousError) and plan.rank == 0 and not join:  # it may serve the others' store
                await asyncio.sleep(ABORT_LINGER_SECONDS)
            plan.store.close()
        raise
    world = ProcessGroup(engine, ranks, name=group_name or "world", timeout=seconds, first_call=1 if join else 0,
                         contexts=contexts)
    install_sigusr1()  # SIGUSR1 dumps the flight recorder (where this is the main thread)
    world.store = PrefixStore(store_prefix, plan.store)  # where NCCL unique ids travel
    if plan.owns_store:
        world.on_close(lambda: loop.run_in_executor(STORE_EXECUTOR, plan.store.close))
    world.on_close(engine.close)
    try:  # a newcomer ends the grow as its members do (grow's last step); a rank of the job, the startup barrier
        await (conclude(world, connected) if join else world.barrier())
    except BaseException:
        await world.close()
        raise
    return world

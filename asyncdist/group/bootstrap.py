"""Bootstrap: from a store, a rank and a world size to a connected engine.

Every rank, through the store:

0. rank 0 marks the rendezvous open; the others wait for that mark, and
   wait on through a store that is lost meanwhile (the last generation's,
   stopping on the same port, see :func:`_wait_for_rank_zero`);
1. claims its rank (a second claim of the same rank is an error) and checks
   that everyone agrees on the world size;
2. learns the job id and secret (from the environment, or made by rank 0);
3. listens on an ephemeral port and publishes ``host:port``;
4. waits for every address, dials the lower ranks, and is dialed by the
   higher ones (each connection authenticated, see ``handshake``).

A rank that detects a problem writes it under the ``abort`` key before
raising, and every rank waiting in the rendezvous raises the same message
instead of running into the timeout.
"""

from __future__ import annotations

import os
import secrets
import time
import uuid

from ..engine.engine import Engine
from .._config import JOB_ID_ENV, SECRET_ENV
from ..errors import RendezvousError, StoreLostError, StoreTimeoutError
from ..wire.handshake import Identity
from ..transport.heartbeat import HeartbeatConfig
from ..rendezvous.store import Store

__all__ = ["bootstrap"]

# How often a waiting rank looks for another rank's abort message.
_ABORT_POLL_SECONDS = 0.2
_ABORT_KEY = "abort"
_OPEN_KEY = "open"  # set by rank 0 first: this rendezvous's store is the one rank 0 uses


async def _abort(store: Store, message: str) -> RendezvousError:
    try:
        await store.async_set(_ABORT_KEY, message)
    except Exception:  # the store may be the thing that failed
        pass
    return RendezvousError(message)


async def _wait_keys(store: Store, keys: list[str], deadline: float, rank: int, what: str) -> None:
    """Wait for ``keys`` until ``deadline`` (time.monotonic), watching for an abort."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            missing = [k for k in keys if not await store.async_check([k])]
            raise RendezvousError(f"rank {rank}: timed out waiting for {what}: {missing} never appeared in the store")
        try:
            await store.async_wait(keys, min(_ABORT_POLL_SECONDS, remaining))
            return
        except StoreTimeoutError:
            if await store.async_check([_ABORT_KEY]):
                raise RendezvousError((await store.async_get(_ABORT_KEY)).decode()) from None


async def _wait_for_rank_zero(store: Store, rank: int, deadline: float) -> None:
    """Wait until rank 0 has opened this rendezvous in ``store``.

    After ``destroy_process_group()``, a rank may call ``init_process_group()``
    while rank 0 still serves the last generation's store on the same port:
    this rank's connection then lands there, where rank 0 of this generation
    never writes, and is lost when rank 0 stops it. So nothing is written
    before rank 0's mark is seen, and a lost store is waited on afresh (the
    client connects again, to rank 0's new store) until ``deadline``.
    """
    while True:
        try:
            await _wait_keys(store, [_OPEN_KEY], deadline, rank, "rank 0 to open the rendezvous")
            return
        except StoreLostError:
            if time.monotonic() >= deadline:
                raise


async def _shared_value(store: Store, key: str, rank: int, make: str | None, deadline: float) -> str:
    """Rank 0 publishes ``make`` (unless set already); everyone returns the published value."""
    if rank == 0 and make is not None:
        await store.async_compare_set(key, "", make)
    await _wait_keys(store, [key], deadline, rank, key)
    return (await store.async_get(key)).decode()


async def bootstrap(
    store: Store, rank: int, world_size: int, *, host: str, timeout: float, heartbeat: HeartbeatConfig | None = None
) -> Engine:
    """Connect this rank to every other rank of the job.

    Args:
        store: the job's store, already scoped to this job and generation.
        rank, world_size: this rank and the job's size (validated by the caller).
        host: the address to listen on and publish.
        timeout: seconds the whole rendezvous may take.
        heartbeat: the engine's heartbeat settings (None: from the environment).

    Raises:
        RendezvousError: duplicate rank, world size mismatch, or a rank missing
            after ``timeout`` (the message says which).
    """
    deadline = time.monotonic() + timeout
    if rank == 0:
        await store.async_set(_OPEN_KEY, "1")
    else:
        await _wait_for_rank_zero(store, rank, deadline)
    claims = await store.async_add(f"rank/{rank}/claims", 1)
    if claims > 1:
        if await store.async_check([f"rank/{r}/address" for r in range(world_size)]):
            # Every rank had joined before this one came: not this run's store. Leave that run alone.
            raise RendezvousError(f"rank {rank}: the store belongs to another run, whose ranks had all joined "
                                  "before this one came: is an earlier job still running on this MASTER_PORT?")
        raise await _abort(store, f"rank {rank} was claimed by {claims} processes: duplicate RANK in the job")
    agreed = (await store.async_compare_set("world_size", "", str(world_size))).decode()
    if agreed != str(world_size):
        raise await _abort(
            store, f"world size mismatch: rank {rank} was started with world_size={world_size}, another rank with {agreed}"
        )

    secret = os.environ.get(SECRET_ENV) or await _shared_value(store, "secret", rank, secrets.token_hex(32), deadline)
    job_id = os.environ.get(JOB_ID_ENV) or await _shared_value(store, "job_id", rank, uuid.uuid4().hex, deadline)
    engine = Engine(Identity(job_id, rank, world_size, secret.encode()), heartbeat=heartbeat)
    try:
        listen_host, port = await engine.listen(host)
        await store.async_set(f"rank/{rank}/address", f"{listen_host}:{port}")
        keys = [f"rank/{r}/address" for r in range(world_size)]
        await _wait_keys(store, keys, deadline, rank, "the addresses of all ranks")
        addresses = {}
        for peer in range(rank):
            peer_host, _, peer_port = (await store.async_get(f"rank/{peer}/address")).decode().rpartition(":")
            addresses[peer] = (peer_host, int(peer_port))
        await engine.connect(addresses, max(deadline - time.monotonic(), 0.001))
    except BaseException:
        await engine.close()
        raise
    return engine


"""Bootstrap: from a store, a rank and a world size to a connected engine.

Every rank, through the store:

0. rank 0 marks the rendezvous open, with its run's id (``ASYNCDIST_JOB_ID``,
   which ``asyncdist-run`` sets for every run; none by hand); the others wait
   for that mark, and wait on through a store that is lost meanwhile (the
   last generation's, stopping on the same port, see
   :func:`_wait_for_rank_zero`). A process of another run (a stale one of an
   earlier run, arriving while this run's ranks gather) reads another run's
   id there and stops with an error, before it claims or aborts anything;
1. claims its rank, by writing who it is (host, pid) under the rank's
   ``owner`` key with compare-and-set: a second process claiming the same rank
   finds the first one there, and both fail naming the two processes; then
   checks that everyone agrees on the world size (the first rank to arrive
   writes its size and rank, so a mismatch names both ranks);
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
import socket
import time
import uuid

from .. import settings
from ..engine.engine import Engine
from ..errors import RendezvousError, StoreError, StoreLostError, StoreTimeoutError
from ..wire.handshake import Identity
from ..transport.heartbeat import HeartbeatConfig
from ..rendezvous.store import Store
from ..rendezvous.waiting import WaitReports, ranks_text as _ranks

__all__ = ["bootstrap", "refuse", "whoami", "ABORT_LINGER_SECONDS"]

# How often a waiting rank looks for another rank's abort message.
_ABORT_POLL_SECONDS = 0.2
#: How long a rank that serves the store keeps it up after an abort, so that
#: the ranks waiting in it read the abort's message rather than a lost store.
ABORT_LINGER_SECONDS = 3 * _ABORT_POLL_SECONDS
_ABORT_KEY = "abort"
# Set by rank 0 once every rank has published its address: "<world size> <local time>".
_JOINED_KEY = "joined"
_OPEN_KEY = "open"  # set by rank 0 first, to its run mark: this rendezvous's store is the one rank 0 uses


def _run_mark(run: str) -> str:
    """What rank 0 writes under the open key: its run's id, "-" for none."""
    return f"run {run}" if run else "-"


def _another_run(rank: int, where: str, theirs: str, mine: str) -> str:
    """The error of a process whose run is not the one that opened the rendezvous."""
    def named(mark: str) -> str:
        return repr(mark.removeprefix("run ")) if mark.startswith("run ") else "one without ASYNCDIST_JOB_ID"

    return (f"rank {rank}: the rendezvous at {where} belongs to another run ({named(theirs)}), and this process "
            f"({whoami()}) is of run {named(mine)}: is it a stale process of an earlier run? It leaves that run "
            "alone (give every rank of one job the same ASYNCDIST_JOB_ID, and each job its own MASTER_PORT)")


async def _abort(store: Store, message: str) -> RendezvousError:
    await refuse(store, message)
    return RendezvousError(message)


async def refuse(store: Store, message: str) -> None:
    """Make every rank waiting in this rendezvous raise ``message`` (best effort:
    the store may be the thing that failed)."""
    try:
        await store.async_set(_ABORT_KEY, message)
    except Exception:  # the store may be the thing that failed
        pass


async def _wait_keys(
    store: Store, keys: dict[str, int], deadline: float, reports: WaitReports, what: str, *, retry_lost: bool = False
) -> None:
    """Wait for ``keys`` (each the key of one rank) until ``deadline``
    (time.monotonic), watching for an abort and reporting whom it waits for.
    ``retry_lost``: a lost store raises StoreLostError, for the caller to wait on."""
    while True:
        now = time.monotonic()
        remaining = deadline - now
        if remaining <= 0:
            missing = [k for k in keys if not await store.async_check([k])]
            raise RendezvousError(f"rank {reports.rank}: timed out waiting for {what}: {missing} never appeared "
                                  "in the store")
        if reports.due(now):
            waiting_for = sorted({r for k, r in keys.items() if not await store.async_check([k])})
            if waiting_for:
                reports.report(time.monotonic(), waiting_for)
        try:
            await store.async_wait(list(keys), min(_ABORT_POLL_SECONDS, remaining))
            return
        except StoreTimeoutError:
            if await store.async_check([_ABORT_KEY]):
                raise RendezvousError((await store.async_get(_ABORT_KEY)).decode()) from None
        except StoreError as exc:
            if retry_lost and isinstance(exc, StoreLostError):
                raise
            raise RendezvousError(f"rank {reports.rank}: lost the store at {reports.where} while waiting for "
                                  f"{what}: {exc} (did the rank serving it fail? its error says why)") from exc


async def _wait_for_rank_zero(store: Store, deadline: float, reports: WaitReports) -> None:
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
            await _wait_keys(store, {_OPEN_KEY: 0}, deadline, reports, "rank 0 to open the rendezvous", retry_lost=True)
            return
        except StoreLostError:
            if time.monotonic() >= deadline:
                raise


async def _shared_value(store: Store, key: str, rank: int, make: str | None, deadline: float,
                        reports: WaitReports) -> str:
    """Rank 0 publishes ``make`` (unless set already); everyone returns the published value."""
    if rank == 0 and make is not None:
        await store.async_compare_set(key, "", make)
    await _wait_keys(store, {key: 0}, deadline, reports, key)
    return (await store.async_get(key)).decode()


def whoami() -> str:
    """This process, as an error message names it: ``pid 1234 on host``."""
    return f"pid {os.getpid()} on {socket.gethostname()}"


async def _already_running(store: Store, rank: int, where: str) -> str:
    """The error of a process that arrives at a rendezvous whose ranks have all joined."""
    size, _, when = (await store.async_get(_JOINED_KEY)).decode().partition(" ")
    return (f"rank {rank}: a job is already running at {where}; its ranks {_ranks(list(range(int(size))))} "
            f"joined at {when}, and this process ({whoami()}) is not one of them: is it a stale process of an "
            "earlier run? (give a new job its own MASTER_PORT)")


async def _claim(store: Store, rank: int, world_size: int, where: str) -> None:
    """Claim ``rank`` and agree on ``world_size``; a conflict aborts every rank.

    Raises:
        RendezvousError: another process holds ``rank`` (both are named), or
            a rank was started with another world size (both ranks are named).
    """
    me = f"{uuid.uuid4().hex} {whoami()}"  # the token tells two processes apart when the pids match
    owner = (await store.async_compare_set(f"rank/{rank}/owner", "", me)).decode()
    if owner != me and await store.async_check([_JOINED_KEY]):  # it completed meanwhile: leave it alone
        raise RendezvousError(await _already_running(store, rank, where))
    if owner != me:
        first = owner.partition(" ")[2]
        raise await _abort(
            store, f"rank {rank} is claimed by two processes ({first} and {whoami()}): "
            "each rank must be started once (duplicate RANK in the job?)"
        )
    agreed = (await store.async_compare_set("world_size", "", f"{world_size} {rank}")).decode()
    size, _, by = agreed.partition(" ")
    if size != str(world_size):
        raise await _abort(
            store, f"world size mismatch: rank {rank} was started with world_size={world_size}, "
            f"rank {by} with world_size={size}: every rank needs the same WORLD_SIZE"
        )


async def bootstrap(
    store: Store, rank: int, world_size: int, *, host: str, timeout: float, heartbeat: HeartbeatConfig | None = None,
    where: str = "the store",
) -> Engine:
    """Connect this rank to every other rank of the job.

    Args:
        store: the job's store, already scoped to this job and generation.
        rank, world_size: this rank and the job's size (validated by the caller).
        host: the address to listen on and publish.
        timeout: seconds the whole rendezvous may take.
        heartbeat: the engine's heartbeat settings (None: from the environment).
        where: the store's address as the user gave it, for the reports of a
            rank that waits (see :mod:`asyncdist.rendezvous.waiting`).

    Raises:
        RendezvousError: duplicate rank, world size mismatch, or a rank missing
            after ``timeout`` (the message says which).
    """
    start = time.monotonic()
    deadline = start + timeout
    reports = WaitReports(rank, world_size, where, start, deadline)
    mine = _run_mark(settings.current().job_id or "")
    if rank == 0:  # (a store opened already: by rank 0 of another run, unless the mark is this run's)
        opened = (await store.async_compare_set(_OPEN_KEY, "", mine)).decode()
    else:
        await _wait_for_rank_zero(store, deadline, reports)
        opened = (await store.async_get(_OPEN_KEY)).decode()
    if opened != mine:
        raise RendezvousError(_another_run(rank, where, opened, mine))
    if await store.async_check([_JOINED_KEY]):  # a running job: neither claim nor abort anything of it
        raise RendezvousError(await _already_running(store, rank, where))
    await _claim(store, rank, world_size, where)

    secret = settings.current().secret or await _shared_value(store, "secret", rank, secrets.token_hex(32), deadline,
                                                                    reports)
    job_id = settings.current().job_id or await _shared_value(store, "job_id", rank, uuid.uuid4().hex, deadline,
                                                                     reports)
    engine = Engine(Identity(job_id, rank, world_size, secret.encode()), heartbeat=heartbeat)
    try:
        listen_host, port = await engine.listen(host)
        await store.async_set(f"rank/{rank}/address", f"{listen_host}:{port}")
        keys = {f"rank/{r}/address": r for r in range(world_size)}
        await _wait_keys(store, keys, deadline, reports, "the addresses of all ranks")
        if rank == 0:  # every rank has claimed its place: a latecomer is not of this job
            await store.async_set(_JOINED_KEY, f"{world_size} {time.strftime('%Y-%m-%d %H:%M:%S')}")
        addresses = {}
        for peer in range(rank):
            peer_host, _, peer_port = (await store.async_get(f"rank/{peer}/address")).decode().rpartition(":")
            addresses[peer] = (peer_host, int(peer_port))
        await engine.connect(addresses, max(deadline - time.monotonic(), 0.001), reports)
    except BaseException:
        await engine.close()
        raise
    return engine


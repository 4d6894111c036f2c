"""Joining a running world: the newcomer's side of :mod:`.growth`.

``init_world(..., join=True)`` comes here instead of to :mod:`.bootstrap`.
The process:

1. waits until the job's ranks have all joined (the rendezvous's ``joined``
   key), and takes the job's id and secret from the environment or, as a rank
   of the job would, from the store;
2. listens on an ephemeral port, then registers in the store's waiting room
   with that address and a proof of the secret (:mod:`asyncdist.rendezvous.joins`);
3. waits until the members call ``grow()``: its verdict is either a refusal
   (raised, with the leader's reason) or an :class:`~.admission.Admission`
   (if the waiting room is closed first, in 1 or 3, the job ended: see
   :func:`asyncdist.rendezvous.joins.close`; it raises ``JoinClosedError``);
4. builds its engine under its new id, dials every member with the job's
   authenticated handshake and accepts the newcomers above it, waiting at
   most the heartbeat timeout (:func:`.admission.connect_seconds`); a peer it
   cannot reach in that time is counted lost.

The caller builds the group from the admission and runs the grow's last
agreement (:func:`.admission.conclude`) on it, as the members do: whether
the connections all formed is judged there, alike on every process. Loop
thread only.
"""

from __future__ import annotations

import time

from .. import settings
from ..settings import JOB_ID_ENV, SECRET_ENV
from ..engine.engine import Engine
from ..errors import RendezvousError
from ..rendezvous import joins
from ..rendezvous.store import Store
from ..transport.connect import open_listener
from ..transport.heartbeat import HeartbeatConfig
from ..wire.handshake import Identity
from .bootstrap import whoami
from .admission import Admission, connect_seconds, give_up_on

__all__ = ["join"]

_JOINED_KEY = "joined"  # bootstrap's: set by rank 0 once every rank of the job has published its address


async def _job_value(store: Store, key: str, env: str, where: str) -> str:
    """The job's id or secret: from ``env`` if set (as the job's ranks read it), else the store."""
    if settings.current().environ.get(env):
        return settings.current().environ[env]
    if not await store.async_check([key]):
        raise RendezvousError(f"join: the job at {where} keeps no {key!r} in its store: its ranks were given "
                              f"{env}; start this process with the same {env}")
    return (await store.async_get(key)).decode()


async def join(
    store: Store, *, host: str, timeout: float, heartbeat: HeartbeatConfig | None, where: str
) -> tuple[Engine, Admission, bool]:
    """Wait to be admitted into the running job at ``store``; return this
    process's engine, its admission, and whether it connected to every
    process of the grown group (those it did not are counted lost).

    Args:
        store: the job's store, under the prefix its ranks use.
        host: the address to listen on and publish.
        timeout: seconds to wait for the job, for a grow and for the connections.
        heartbeat: the engine's heartbeat settings.
        where: the store's address, for messages.

    Raises:
        JoinClosedError: the job ended before any grow admitted this process.
        RendezvousError: no job runs at ``store`` within ``timeout``; the
            members refused this process (wrong secret, or the grow that
            claimed it failed); no grow came in time.
    """
    deadline = time.monotonic() + timeout
    me = f"joining process ({whoami()})"
    if not await joins.wait_open(store, _JOINED_KEY, deadline, me):
        raise RendezvousError(f"{me}: no job is running at {where} (its ranks have not all joined within "
                              f"{timeout:g} s)")
    secret = (await _job_value(store, "secret", SECRET_ENV, where)).encode()
    job_id = await _job_value(store, "job_id", JOB_ID_ENV, where)
    listener = open_listener(host)
    try:
        registration = joins.Registration.make(secret, job_id, host, listener.getsockname()[1], whoami())
        slot = await joins.register(store, registration)
        verdict = await joins.wait_verdict(store, slot, deadline, me)
    except BaseException:
        listener.close()
        raise
    if "refused" in verdict:
        listener.close()
        raise RendezvousError(f"{me}: the running job refused to admit it: {verdict['refused']}")
    admission = Admission.from_json(verdict["admitted"])
    engine = Engine(Identity(job_id, admission.id, admission.world_size, secret), heartbeat=heartbeat)
    engine.widen(admission.world_size, admission.context)
    wait = connect_seconds(engine)
    try:
        await engine.listen(host, listener)
        missing = await engine.reach(admission.peers(), admission.members, wait)
    except BaseException:
        await engine.close()
        raise
    give_up_on(engine, missing, wait)
    return engine, admission, not missing

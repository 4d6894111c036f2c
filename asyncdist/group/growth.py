"""Growing a group: its members admit the processes waiting to join.

``await group.grow()`` is a collective call of the group's members; the
processes waiting in the job's store (``init_world(..., join=True)``, see
:mod:`.joining` and :mod:`asyncdist.rendezvous.joins`) take part from
their side. In order:

1. the members agree (all-reduce, MAX) on the job's id space and on the
   engine's context counter: a newcomer gets an id never used in the job,
   ``size``, ``size + 1``, ... (ids of lost ranks, and of newcomers of a
   failed grow, are not reused), and a counter in step with the members'
   (for the groups made later); the grown group's own contexts are derived
   (:mod:`.contexts`) from this group's and the grow's first new id, so
   that ranks outside this group keep their counters in step;
2. the leader (group rank 0, the lowest live rank after a shrink) claims
   the waiting registrations, refuses those not made with the job's secret
   (their processes raise, saying so) and broadcasts the newcomers;
3. every member widens its engine's id space (its handshake now accepts
   the newcomers' ids), then the members run this group's fault-tolerant
   agreement (:mod:`.agreement`) on whether steps 1-3 worked on each: it
   also makes sure all have widened before anyone is admitted. If a member
   was lost or a step failed, every survivor revokes this group and raises
   the same :class:`~asyncdist.errors.PeerLostError` (shrink, then grow
   again); the claimed newcomers are refused, so they raise at once;
4. nobody waiting: ``grow`` returns *this same group* (no context is used);
5. otherwise the leader writes each newcomer its admission (ids, addresses,
   contexts), the newcomers dial every member (the higher id dials, as at
   init, with the authenticated handshake), each process waits for the
   others' connections at most the heartbeat timeout
   (:func:`.admission.connect_seconds`; one that never connects is counted
   lost), and everyone builds the grown group, members first in their
   order, then the newcomers;
6. the grown group's agreement #0 (:func:`.admission.conclude`), on whether
   every step worked on every process: all return the grown group, or all
   survivors raise the same error, naming the lost ranks (this group is then
   revoked on the members).

Every member runs exactly one agreement of this group per grow, on every
path, so that agreement numbers stay in step for the shrink that follows a
failure. The grown group takes over what closing this one released (the
engine, the store): close the grown group at the end, not this one. This
group stays usable meanwhile, unless the grow failed. The store must still
be served: under ``asyncdist-run`` the launcher serves it; with ``env://``
by hand rank 0 serves it, so rank 0 must be alive.

Loop thread only.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from datetime import timedelta
from typing import Any, Callable, Protocol, Sequence, TypeVar

import numpy as np

from ..engine.engine import Engine
from ..errors import AsyncDistError, InvalidArgumentError, RendezvousError
from ..reduce.op import ReduceOp
from ..rendezvous import joins
from ..rendezvous.store import Store
from ..timeouts import as_seconds
from .admission import Admission, conclude, connect_seconds, failed, give_up_on, refuse_unanswered
from .calls import Calls
from .contexts import derived_contexts
from .fault import FaultTolerance
from .members import Members

__all__ = ["grow"]

G = TypeVar("G", bound="Growing")
G_co = TypeVar("G_co", bound="Growing", covariant=True)


class Growing(Protocol):
    """A group, as growing it uses it: a ProcessGroup, which this module cannot
    import (process_group imports it, and group/ allows no import cycle)."""

    engine: Engine
    members: Members
    calls: Calls
    faults: FaultTolerance[Any]
    store: Store | None  # set on the grown group: the store it takes over

    @property
    def rank(self) -> int: ...

    @property
    def ranks(self) -> tuple[int, ...]: ...

    @property
    def name(self) -> str: ...

    @property
    def timeout(self) -> float: ...

    async def all_reduce(self, tensor: Any, op: Any = ...) -> None: ...

    async def broadcast_object_list(self, object_list: list, src: int = ...) -> None: ...

    async def revoke(self) -> None: ...

    async def close(self) -> None: ...

    def pass_on(self: G, successor: G) -> None: ...


class GroupMaker(Protocol[G_co]):
    """Builds a group (the ProcessGroup constructor)."""

    def __call__(self, engine: Engine, ranks: Sequence[int], *, name: str, timeout: float, first_call: int,
                 contexts: Callable[[], int] | None) -> G_co: ...


async def _claim(group: Growing, store: Store, first_id: int, at_least: int, deadline: float) -> list[list[Any]]:
    """The leader's part: the newcomers as ``[id, host, port, slot]``, refusals answered."""
    engine = group.engine
    newcomers: list[list[Any]] = []
    refusals: dict[int, dict[str, Any]] = {}
    for slot, registration in await joins.claim(store, at_least, deadline):
        if registration.proven(engine.me.secret, engine.me.job_id):
            newcomers.append([first_id + len(newcomers), registration.host, registration.port, slot])
        else:
            refusals[slot] = {"refused": (
                f"rank {engine.rank} of group {group.name!r} refused a joining process ({registration.who}): "
                "its registration was not made with this job's secret (is its ASYNCDIST_SECRET not the job's?)")}
    await joins.answer(store, refusals)
    return newcomers


async def _admit(group: Growing, store: Store, newcomers: list[list[Any]], world_size: int, context: int) -> None:
    """The leader's part: publish each newcomer's address and admission."""
    for new_id, host, port, _ in newcomers:
        await store.async_set(f"rank/{new_id}/address", f"{host}:{port}")
    addresses: dict[str, list[Any]] = {}
    for member in group.ranks:
        host, _, port = (await store.async_get(f"rank/{member}/address")).decode().rpartition(":")
        addresses[str(member)] = [host, int(port)]
    addresses.update({str(new_id): [host, port] for new_id, host, port, _ in newcomers})
    members = [*group.ranks, *(n[0] for n in newcomers)]
    parent, label = group.calls.collective_context, _label(newcomers)
    await joins.answer(store, {slot: {"admitted": asdict(Admission(new_id, members, addresses, world_size, context,
                                                                   parent, label, group.name))}
                               for new_id, _, _, slot in newcomers})


def _label(newcomers: list[list[Any]]) -> str:
    """Which grow of the job this is: its first new id, never the same twice in a job."""
    return f"g{newcomers[0][0]}"


async def _plan(group: Growing, store: Store, min_joiners: int, deadline: float) -> tuple[Any, int]:
    """Steps 1-3 of the module docstring: the newcomers (a list; or the leader's
    error, a str), every member's engine widened for them, agreed by this group.

    Raises:
        PeerLostError: a member was lost (this group is then revoked on every survivor).
    """
    engine = group.engine
    plan: list[Any] = [None]
    ok, context = 1, 0
    try:
        agreed = np.array([engine.world_size, engine.next_context], np.int64)
        await group.all_reduce(agreed, op=ReduceOp.MAX)
        first_id, context = int(agreed[0]), int(agreed[1])
        if group.rank == 0:
            try:
                plan[0] = await _claim(group, store, first_id, min_joiners, deadline)
            except AsyncDistError as exc:  # told to the others, who wait in the broadcast
                plan[0] = f"rank {engine.rank} (the grow's leader): {exc}"
        await group.broadcast_object_list(plan, src=0)
        if isinstance(plan[0], list) and plan[0]:
            engine.widen(first_id + len(plan[0]), context)
    except AsyncDistError:  # a member lost, most likely: the others may wait on this one
        ok = 0
        await group.revoke()
    decision = await group.faults.decide(ok, timeout=group.timeout, what="grow()")
    if decision.failed or not decision.value:
        await _fail(group, store, plan[0], decision.failed)
    return plan[0], context


async def _fail(group: Growing, store: Store, plan: Any, lost: frozenset[int]) -> None:
    """Raise the error of a failed grow, after revoking this group and refusing the claimed newcomers."""
    await group.revoke()
    error = failed(group.engine.rank, group.name, lost)
    if isinstance(plan, list):  # those who hold the plan refuse its newcomers: one of them may be the survivor
        await refuse_unanswered(store, [n[3] for n in plan], f"the grow of group {group.name!r} that claimed "
                                                              f"it failed: {error}")
    raise error


async def grow(
    group: G, make: GroupMaker[G], *, timeout: timedelta | float | None = None, min_joiners: int = 0
) -> G:
    """Admit the processes waiting to join (``init_world(..., join=True)``); return
    the bigger group, the same on members and newcomers (``ProcessGroup.grow``).

    A collective call of the group's members; newcomers get the next ranks
    (this size, size + 1, ...) and ids never used in the job. See the module
    docstring and docs/fault-tolerance.md.

    Args:
        group: the members' group (the world, or what a shrink left).
        make: builds the grown group (``type(group)``: the ProcessGroup constructor).
        timeout: seconds (or a ``timedelta``) to wait for ``min_joiners``; None:
            the group's. Each other step has the group's timeout, and the
            connections the heartbeat timeout.
        min_joiners: wait until at least this many processes wait to join
            (0: admit whoever waits now, maybe nobody).

    Returns:
        *This same group* when nobody was waiting; else the grown group, which
        now owns the engine and store (close it, not this one).

    Raises:
        InvalidArgumentError: the group has no store, or a bad argument.
        RendezvousError: fewer than ``min_joiners`` came in time (the same on
            every member; the group stays usable).
        PeerLostError: a member or a newcomer was lost during the grow: every
            survivor raises it, naming the same lost ranks, and this group is
            revoked (shrink it, then grow again).

    Example::

        world = await world.grow()  # at a step the members choose
    """
    group.members.check_member()
    store = group.store
    if store is None:
        raise InvalidArgumentError(f"grow: group {group.name!r} has no store to find joining processes in")
    if type(min_joiners) is not int or min_joiners < 0:
        raise InvalidArgumentError(f"grow: min_joiners must be a non-negative int, got {min_joiners!r}")
    seconds = as_seconds(timeout, default=group.timeout, what="grow: timeout")
    plan, context = await _plan(group, store, min_joiners, time.monotonic() + seconds)
    if isinstance(plan, str):
        raise RendezvousError(plan)
    newcomers: list[list[Any]] = plan
    if not newcomers:
        return group
    engine = group.engine
    ok = True
    if group.rank == 0:
        try:
            await _admit(group, store, newcomers, engine.world_size, context)
        except AsyncDistError:  # the newcomers never dial: every process counts them lost
            ok = False
    new_ids = [n[0] for n in newcomers]
    wait = connect_seconds(engine)
    missing = await engine.reach({}, new_ids, wait)
    give_up_on(engine, missing, wait)
    grown = make(engine, [*group.ranks, *new_ids], name=group.name, timeout=group.timeout, first_call=1,
                 contexts=derived_contexts(group.calls.collective_context, _label(newcomers)))
    grown.store = store
    try:
        await conclude(grown, ok and not missing)
    except AsyncDistError as exc:
        await grown.close()
        await group.revoke()
        await refuse_unanswered(store, [n[3] for n in newcomers], f"the grow of group {group.name!r} that "
                                                                   f"admitted it failed: {exc}")
        raise
    group.pass_on(grown)
    return grown

"""Growing a group: its members admit the processes waiting to join.

``await group.grow()`` is a collective call of the group's members; the
processes waiting in the job's store (``init_world(..., join=True)``, see
:mod:`.joining` and :mod:`asyncdist.rendezvous.joins`) take part from
their side. In order:

1. the members agree (all-reduce, MAX) on the job's id space and on the
   engine's context counter: a newcomer gets an id never used in the job,
   ``size``, ``size + 1``, ... (ids of lost ranks are not reused), and a
   counter in step with the members' (for the groups made later); the grown
   group's own contexts are derived (:mod:`.contexts`) from this group's and
   the grow's first new id, so that ranks outside this group keep their
   counters in step;
2. the leader (group rank 0, the lowest live rank after a shrink) claims
   the waiting registrations, refuses those not made with the job's secret
   (their processes raise, saying so) and broadcasts the newcomers;
3. nobody waiting: ``grow`` returns *this same group* (no context is used,
   nothing else is sent: one all-reduce and one broadcast);
4. otherwise every member widens its engine's id space (its handshake now
   accepts the newcomers' ids), a barrier makes sure all have, the leader
   writes each newcomer its admission (ids, addresses, contexts), the
   newcomers dial every member (the higher id dials, as at init, with the
   authenticated handshake), and everyone builds the grown group, members
   first in their order, then the newcomers, and runs its call #0 (a barrier).

The grown group takes over what closing this one released (the engine, the
store): close the grown group at the end, not this one. This group stays
usable meanwhile. The store must still be served: under ``asyncdist-run``
the launcher serves it; with ``env://`` by hand rank 0 serves it, so rank 0
must be alive.

Loop thread only.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any, Callable, Protocol, Sequence, TypeVar

import numpy as np

from ..engine.engine import Engine
from ..errors import AsyncDistError, InvalidArgumentError, RendezvousError
from ..reduce.op import ReduceOp
from ..rendezvous import joins
from ..rendezvous.store import Store
from ..timeouts import as_seconds
from .calls import Calls
from .contexts import derived_contexts
from .members import Members

__all__ = ["Admission", "grow", "ADMITTED_CONNECT_SECONDS"]

G = TypeVar("G", bound="Growing")
G_co = TypeVar("G_co", bound="Growing", covariant=True)


class Growing(Protocol):
    """A group, as growing it uses it: a ProcessGroup, which this module cannot
    import (process_group imports it, and group/ allows no import cycle)."""

    engine: Engine
    members: Members
    calls: Calls
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

    async def barrier(self) -> None: ...

    def pass_on(self: G, successor: G) -> None: ...


class GroupMaker(Protocol[G_co]):
    """Builds a group (the ProcessGroup constructor)."""

    def __call__(self, engine: Engine, ranks: Sequence[int], *, name: str, timeout: float, first_call: int,
                 contexts: Callable[[], int] | None) -> G_co: ...

#: The longest the members wait for an admitted process to connect. A live
#: one dials as soon as it reads its admission (well under a second); one that
#: registered and then died never does, and the grow fails after this long
#: instead of after the group's timeout (30 minutes by default).
ADMITTED_CONNECT_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class Admission:
    """What the leader of a grow tells one newcomer (JSON in the store).

    Attributes:
        id: the newcomer's job-unique id (its global rank).
        members: the grown group's ids, in group-rank order.
        addresses: ``(host, port)`` of every member, by id, as text keys (JSON).
        world_size: the job's id space after the grow.
        context: the members' engine context counter (where the newcomer's starts).
        parent, label: whence the grown group's contexts are derived (see
            :mod:`.contexts`): the members' group's collective context, and
            which grow of the job it is.
        name: the group's name.
    """

    id: int
    members: list[int]
    addresses: dict[str, list[Any]]
    world_size: int
    context: int
    parent: int
    label: str
    name: str

    def contexts(self) -> Callable[[], int]:
        """The grown group's context allocator, as the members derive it."""
        return derived_contexts(self.parent, self.label)

    @classmethod
    def from_json(cls, fields: dict[str, Any]) -> Admission:
        return cls(**fields)

    def peers(self) -> dict[int, tuple[str, int]]:
        """The members' addresses, by id."""
        return {int(k): (str(host), int(port)) for k, (host, port) in self.addresses.items()}


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
        timeout: seconds (or a ``timedelta``) for the whole grow; None: the group's.
        min_joiners: wait until at least this many processes wait to join
            (0: admit whoever waits now, maybe nobody).

    Returns:
        *This same group* when nobody was waiting; else the grown group, which
        now owns the engine and store (close it, not this one).

    Raises:
        InvalidArgumentError: the group has no store, or a bad argument.
        RendezvousError: fewer than ``min_joiners`` came in time, or an
            admitted process never connected.
        PeerLostError: a member was lost meanwhile (shrink, then grow again).

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
    deadline = time.monotonic() + seconds
    engine = group.engine
    agreed = np.array([engine.world_size, engine.next_context], np.int64)
    await group.all_reduce(agreed, op=ReduceOp.MAX)
    first_id, context = int(agreed[0]), int(agreed[1])
    plan: list[Any] = [None]
    if group.rank == 0:
        try:
            plan[0] = await _claim(group, store, first_id, min_joiners, deadline)
        except AsyncDistError as exc:  # told to the others, who wait in the broadcast
            plan[0] = f"rank {engine.rank} (the grow's leader): {exc}"
    await group.broadcast_object_list(plan, src=0)
    if isinstance(plan[0], str):
        raise RendezvousError(plan[0])
    newcomers: list[list[Any]] = plan[0]
    if not newcomers:
        return group
    world_size = first_id + len(newcomers)
    engine.widen(world_size, context)
    await group.barrier()  # every member accepts the newcomers' ids before any of them dials
    if group.rank == 0:
        await _admit(group, store, newcomers, world_size, context)
    new_ids = [n[0] for n in newcomers]
    await engine.connect({}, min(max(deadline - time.monotonic(), 0.001), ADMITTED_CONNECT_SECONDS), peers=new_ids)
    grown = make(engine, [*group.ranks, *new_ids], name=group.name, timeout=group.timeout, first_call=0,
                 contexts=derived_contexts(group.calls.collective_context, _label(newcomers)))
    grown.store = store
    group.pass_on(grown)
    await grown.barrier()
    return grown

"""What a grow tells its newcomers, and how it ends: the admission, and the
agreement that every process of the grown group runs last.

:mod:`.growth` (the members' side) and :mod:`.joining` (the newcomers' side)
share this module:

* :class:`Admission`: the leader's answer to one newcomer (JSON in the store);
* :func:`connect_seconds`: how long the processes of a grow wait for each
  other's connections (the heartbeat timeout: a live process dials within
  milliseconds of reading its admission; one that never does is dead);
* :func:`conclude`: the grown group's first agreement (#0), on whether every
  step worked on every process. Every process that returns from it gets the
  same answer, so all return the grown group, or all raise the same error;
* :func:`refuse_unanswered`: after a failed grow, tell the claimed newcomers
  that no admission will come, so that they raise at once.

Loop thread only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol

from ..engine.engine import Engine
from ..errors import AsyncDistError, PeerLostError, RendezvousError
from ..rendezvous import joins
from ..rendezvous.store import Store
from .contexts import derived_contexts
from .fault import FaultTolerance

__all__ = ["Admission", "ADMITTED_CONNECT_SECONDS", "connect_seconds", "conclude", "failed", "refuse_unanswered"]

#: How long the processes of a grow wait for each other's connections when
#: the heartbeat is off (with it on, they wait the heartbeat timeout).
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


class Grown(Protocol):
    """The grown group, as concluding a grow uses it (a ProcessGroup)."""

    engine: Engine
    faults: FaultTolerance[Any]

    @property
    def name(self) -> str: ...

    @property
    def timeout(self) -> float: ...


def connect_seconds(engine: Engine) -> float:
    """How long a process of a grow waits for the others' connections: the
    heartbeat timeout (a peer silent that long is lost anyway), or
    :data:`ADMITTED_CONNECT_SECONDS` when the heartbeat is off."""
    return engine.heartbeat_timeout or ADMITTED_CONNECT_SECONDS


def give_up_on(engine: Engine, missing: Iterable[int], seconds: float) -> None:
    """Count the processes of a grow that did not connect in time as lost
    (expelled: one that dials later is refused), so that the agreement does
    not wait for them."""
    for rank in missing:
        if not engine.is_lost(rank):
            engine.faults.expel(rank, f"it did not connect to rank {engine.rank} within {seconds:g} s of "
                                      "the grow's admission (a process that died?)")


def failed(me: int, name: str, lost: Iterable[int]) -> AsyncDistError:
    """The error every survivor of a failed grow raises: the same lost ranks on each."""
    ids = sorted(lost)
    if not ids:
        return RendezvousError(f"rank {me}: grow() of group {name!r} failed on another process (its log says "
                               "why); nobody was lost: grow again")
    return PeerLostError(f"rank {me}: grow() of group {name!r} failed: global rank(s) {ids} were lost during it "
                         "(every survivor agrees); the group grow() was called on is revoked: shrink it, "
                         "then grow again", ids[0])


async def conclude(grown: Grown, ok: bool) -> None:
    """The grow's last step, on every process of the grown group: agreement #0
    of the grown group on whether every step worked here (``ok``).

    Raises:
        PeerLostError: a process of the grow was lost (the same lost ranks on every survivor).
        RendezvousError: a step failed elsewhere, though nobody was lost.
        RankExcludedError: the others counted this process as lost.
    """
    decision = await grown.faults.decide(int(ok), timeout=grown.timeout, what="grow()")
    if decision.failed or not decision.value:
        raise failed(grown.engine.rank, grown.name, decision.failed)


async def refuse_unanswered(store: Store, slots: Iterable[int], why: str) -> None:
    """Refuse the claimed slots that have no verdict yet (compare-and-set: an
    admission already written stays), so that their processes raise now
    instead of waiting for an admission that will not come. Best effort: a
    store that fails is left alone (the grow's own error says more)."""
    for slot in slots:
        try:
            await joins.answer_once(store, slot, {"refused": why})
        except AsyncDistError:
            return

"""A world of ranks as Ray actors: placed, joined and driven from the Ray driver.

:func:`ray_world` reserves one bundle per rank in a Ray placement group
(``PACK``: as few nodes as possible; ``SPREAD``: one rank per node where it
can), starts one async actor (:class:`~.rank.Rank`) in each bundle, and has
them rendezvous through Ray alone: rank 0's actor serves the store and its
address reaches the others as a Ray object (``serve_store.remote()``'s
ObjectRef, passed as an argument, which Ray resolves before the call). No
MASTER_ADDR, no fixed port.

The driver then runs functions on every rank with :meth:`RayWorld.run`
(blocking) or :meth:`RayWorld.submit` (ObjectRefs, which an asyncio driver
can await). Errors cross back as asyncdist's own: a rank's exception is
re-raised as itself, and a rank whose actor died (``ray.kill``, a crash, a lost
node) as :class:`~asyncdist.errors.PeerLostError` naming that rank; the other
ranks get PeerLostError from asyncdist's own connections and heartbeat.

After a lost rank, the survivors' functions shrink (:func:`~.rank.shrink`)
and grow (:func:`~.rank.grow`) their group; an actor that Ray restarts
rejoins with :meth:`RayWorld.rejoin`. The driver's :attr:`RayWorld.actors`
then follows the ranks' current group (:meth:`RayWorld.refresh`).

This module and :mod:`asyncdist.ray` are the only ones that import Ray.
"""

from __future__ import annotations

import inspect
import secrets
import time
from typing import Any, Callable, Literal

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError, RayTaskError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from ..errors import InvalidArgumentError, PeerLostError, RendezvousError
from ..transport.heartbeat import HeartbeatConfig
from .rank import Rank

__all__ = ["RayWorld", "ray_world"]

Strategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]
_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


class RayWorld:
    """n ranks, each an async Ray actor, joined into one asyncdist world.

    Made by :func:`ray_world`. Use it as a context manager, or call
    :meth:`shutdown`, to close the ranks and free their placement group.

    Attributes:
        actors: the rank actors' handles, by rank in the ranks' current group
            (after a shrink or grow: as :meth:`refresh` last found it).
        placement_group: the Ray placement group the ranks run in.
        nodes: each rank's node address, by rank.
        ranks: each rank's id in the job, by rank (``range(n)`` at first; after
            a shrink and a rejoin, e.g. ``(0, 1, 3)``: a rejoined actor gets a new id).
        address: the store's ``(host, port)`` in rank 0's actor, as the
            ObjectRef that rank 0 answered (Ray resolves it in each call it is passed to).
    """

    def __init__(self, actors: list[Any], group: PlacementGroup, nodes: list[str], timeout: float) -> None:
        self.actors = actors
        self.placement_group = group
        self.nodes = nodes
        self.ranks: tuple[int, ...] = tuple(range(len(actors)))
        self.address: Any = None  # the ObjectRef of the store's (host, port), once served
        self._known = list(actors)  # every handle that may be a member: the first ranks, then the rejoined
        self._changing = False  # a kill or rejoin happened: refresh after the next gather
        self._store_lost = False  # rank 0's actor, which serves the store, was killed by kill()
        self._restarting: list[Any] = []  # actors kill() had restarted whose new instance rejoin() has not seen
        self._timeout = timeout  # ray_world's: also how long rejoin() waits for a restarting actor

    @property
    def size(self) -> int:
        """The number of ranks."""
        return len(self.actors)

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[ray.ObjectRef]:
        """Start ``fn`` on every rank; returns one ObjectRef per rank (any thread).

        An ``async def`` function is called as ``await fn(world, *args,
        **kwargs)`` on the actor's event loop, with the rank's await-API world
        (a :class:`~asyncdist.group.process_group.ProcessGroup`). Any other
        function is called as ``fn(*args, **kwargs)`` on the rank's own thread,
        after ``init_process_group``, so it may use the blocking facade
        (``import asyncdist as dist``). Each face joins its world on first use.
        ``fn`` and its arguments travel to the actors by Ray's pickling.
        """
        method = "run_async" if inspect.iscoroutinefunction(fn) else "run_blocking"
        return [getattr(actor, method).remote(fn, args, kwargs) for actor in self.actors]

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        """Run ``fn`` on every rank (see :meth:`submit`) and return the results by rank (blocks).

        Raises:
            AsyncDistError: the first failed rank's own error (by rank), after
                every rank has finished; a rank whose actor died raises
                :class:`~asyncdist.errors.PeerLostError` naming it.
        """
        return _results(self.gather(self.submit(fn, *args, **kwargs)))

    def gather(self, refs: list[ray.ObjectRef]) -> list[Any]:
        """Wait for one ObjectRef per rank; returns each rank's result or its error
        (translated as :meth:`run` says), by rank (blocks)."""
        outcomes: list[Any] = []
        for rank, ref in enumerate(refs):
            try:
                outcomes.append(ray.get(ref))
            except (RayTaskError, RayActorError) as exc:
                outcomes.append(_translate(exc, rank))
        if self._changing:
            self._refresh(strict=False)
        return outcomes

    def kill(self, rank: int, *, restart: bool = False) -> None:
        """Kill rank ``rank``'s actor at once, as a crash would (``ray.kill``).

        With ``restart=True``, Ray restarts it where its ``max_restarts``
        (``actor_options``) allows; the restarted actor has no world until
        :meth:`rejoin`. Rank 0's actor serves the store: a world that lost it
        can neither shrink nor grow.
        """
        self._changing = True
        self._store_lost |= self.actors[rank] is self._known[0]  # ray.kill returns before the actor is dead
        if restart:
            self._restarting.append(self.actors[rank])
        ray.kill(self.actors[rank], no_restart=not restart)

    def rejoin(self, actor: Any) -> ray.ObjectRef:
        """Have ``actor`` (one that Ray restarted) join the running world through
        its store, as a newcomer (``init_world(..., join=True)``); returns an
        ObjectRef to its rank in the grown group, ready once the ranks'
        function calls :func:`asyncdist.ray.grow` (e.g. ``min_joiners=1``).

        Blocks until Ray has restarted the actor (at most the world's
        ``timeout``): Ray fails, rather than queues, a call made while an
        actor restarts, and :meth:`kill` returns before the old instance is gone.

        Raises:
            PeerLostError: rank 0's actor, which serves the store, died or was
                restarted (its store went with it).
            InvalidArgumentError: ``actor`` is alive in a world (not restarted).
            RendezvousError: ``actor`` is dead (Ray will not restart it), or
                still restarting after ``timeout``.
        """
        try:
            serving = not self._store_lost and ray.get(self._known[0].serves_store.remote())
        except RayActorError:
            serving = False
        if not serving:
            raise PeerLostError("ray_world: rank 0's actor, which serves the world's store, died or was restarted: "
                                "no actor can rejoin this world (keep rank 0 alive, or start a new world)", 0)
        self._wait_until_restarted(actor)
        self._changing = True
        if not any(actor is known for known in self._known):
            self._known.append(actor)
        return actor.join.remote(self.address)

    def _wait_until_restarted(self, actor: Any) -> None:
        """Return once ``actor``'s restarted instance answers: one with no world."""
        deadline = time.monotonic() + self._timeout
        pause = 0.05
        while True:
            try:
                membership = ray.get(actor.membership.remote(), timeout=max(deadline - time.monotonic(), 0.0))
            except ActorUnavailableError:  # restarting (Ray answers at once), or the old instance dying
                membership = ()
            except RayActorError as exc:
                raise RendezvousError(f"RayWorld.rejoin: the actor is dead and Ray will not restart it "
                                      f"(is its max_restarts spent?): {exc}") from None
            except GetTimeoutError:
                raise RendezvousError(f"RayWorld.rejoin: the actor did not answer within {self._timeout:g} s") from None
            if membership is None:
                self._restarting = [a for a in self._restarting if a is not actor]
                return
            if membership and not any(actor is a for a in self._restarting):
                rank, ids, _ = membership
                raise InvalidArgumentError(f"RayWorld.rejoin: the actor is rank {rank} of a running world "
                                           f"(job ids {list(ids)}); only an actor that Ray restarted can rejoin")
            if time.monotonic() + pause > deadline:
                raise RendezvousError(f"RayWorld.rejoin: the actor was still restarting after {self._timeout:g} s")
            time.sleep(pause)  # Ray has no call that waits for a restart: look again shortly
            pause = min(2 * pause, 1.0)

    def refresh(self) -> tuple[int, ...]:
        """Ask every actor for its rank in its current group (after a shrink or
        grow) and renumber :attr:`actors`, :attr:`nodes` and :attr:`ranks` by it;
        returns :attr:`ranks` (blocks). A dead actor, or a restarted one that
        has not rejoined, is left out. :meth:`gather` (so :meth:`run`) does this
        by itself after a kill or a rejoin.

        Raises:
            RendezvousError: the live actors are not all in one group (a shrink
                or grow is still under way, or some ranks did not take part).
        """
        self._refresh(strict=True)
        return self.ranks

    def _refresh(self, *, strict: bool) -> None:
        members: dict[int, tuple[Any, str]] = {}
        groups: set[tuple[int, ...]] = set()
        silent = self._ask(self._known, members, groups, settle=False)
        if len(groups) == 1 and len(members) < len(next(iter(groups))):
            # The members count in a newcomer whose join is still finishing: wait for it.
            silent = self._ask(silent, members, groups, settle=True)
        if len(groups) != 1 or sorted(members) != list(range(len(next(iter(groups))))):
            if strict:
                raise RendezvousError(f"RayWorld.refresh: the live actors are not all in one group (ranks "
                                      f"{sorted(members)} of groups {sorted(groups)}): is a shrink or grow under way?")
            return
        self.actors = [members[r][0] for r in sorted(members)]
        self.nodes = [members[r][1] for r in sorted(members)]
        (self.ranks,) = groups
        self._changing = bool(silent)  # an actor with no world yet may be joining: look again next time

    @staticmethod
    def _ask(actors: list[Any], members: dict[int, tuple[Any, str]], groups: set[tuple[int, ...]],
             settle: bool) -> list[Any]:
        """Add each of ``actors``' membership to ``members`` and ``groups``;
        returns the live actors that have no world."""
        silent = []
        for actor, outcome in zip(actors, _outcomes([a.membership.remote(settle) for a in actors])):
            if outcome is None:
                silent.append(actor)
            elif not isinstance(outcome, BaseException):
                rank, ids, node = outcome
                members[rank] = (actor, node)
                groups.add(ids)
        return silent

    def shutdown(self) -> None:
        """Close every live rank (rank 0's actor, which serves the store, last),
        then end the actors and free the placement group (blocks; idempotent)."""
        if self._known:
            first, *others = self._known
            _outcomes([actor.close.remote() for actor in others])
            _outcomes([first.close.remote()])
            for actor in self._known:
                ray.kill(actor, no_restart=True)
            self.actors, self._known = [], []
            remove_placement_group(self.placement_group)

    def __enter__(self) -> RayWorld:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()


def ray_world(
    n: int,
    *,
    strategy: Strategy = "PACK",
    cpus_per_rank: float = 1.0,
    timeout: float = 300.0,
    heartbeat: HeartbeatConfig | None = None,
    actor_options: dict[str, Any] | None = None,
) -> RayWorld:
    """Start ``n`` ranks as Ray actors in a placement group and join them (blocks).

    Ray must be initialised (``ray.init(...)``) or reachable; the ranks run
    wherever the placement group puts them.

    Args:
        n: the number of ranks (>= 1).
        strategy: the placement group's strategy: ``"PACK"`` (few nodes) or
            ``"SPREAD"`` (many nodes), or their ``STRICT_`` forms.
        cpus_per_rank: CPUs reserved per rank (each rank's bundle and actor).
        timeout: seconds; bounds the placement, the rendezvous and every
            operation of the ranks' worlds.
        heartbeat: the await worlds' heartbeat, which bounds how long a killed
            rank goes unnoticed (None: ``ASYNCDIST_HEARTBEAT_*`` as read by the actors).
        actor_options: more ``.options(...)`` for every rank actor (e.g. ``runtime_env``).

    Returns:
        The :class:`RayWorld`; its ranks have joined the store, and join each
        face's world on the first function that uses it.

    Raises:
        InvalidArgumentError: ``n`` < 1, an unknown strategy or a bad CPU count.
        RendezvousError: the placement group was not placed, or the ranks did
            not reach rank 0's store, within ``timeout``.
        StoreError: a rank could not serve or reach the store (its own error).

    Example::

        ray.init(num_cpus=4)
        with ray_world(4) as world:
            async def total(pg):
                x = np.ones(2) * pg.rank
                await pg.all_reduce(x)
                return x
            print(world.run(total))     # four arrays of [6., 6.]
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidArgumentError(f"ray_world: n must be an int >= 1, got {n!r}")
    if strategy not in _STRATEGIES:
        raise InvalidArgumentError(f"ray_world: strategy must be one of {_STRATEGIES}, got {strategy!r}")
    if not cpus_per_rank >= 0:
        raise InvalidArgumentError(f"ray_world: cpus_per_rank must be >= 0, got {cpus_per_rank!r}")
    group = placement_group([{"CPU": cpus_per_rank}] * n, strategy=strategy)
    ready, _ = ray.wait([group.ready()], timeout=timeout)
    if not ready:
        remove_placement_group(group)
        raise RendezvousError(f"ray_world: the placement group of {n} bundles of {cpus_per_rank:g} CPU "
                              f"({strategy}) was not placed within {timeout:g} s: does the cluster have the CPUs?")
    actor_class = ray.remote(Rank)
    secret = secrets.token_hex(16)
    actors: list[Any] = [
        actor_class.options(
            num_cpus=cpus_per_rank,
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank),
            **(actor_options or {}),
        ).remote(rank, n, secret, timeout, heartbeat, ray.util.get_node_ip_address)
        for rank in range(n)
    ]
    world = RayWorld(actors, group, [], timeout)
    try:
        address = actors[0].serve_store.remote()  # an ObjectRef: Ray hands the value to each connect
        world.address = address  # rejoin() passes it on the same way
        joins = [actor.connect.remote(address) for actor in actors]
        joined, _ = ray.wait(joins, num_returns=n, timeout=timeout)
        if len(joined) < n:
            raise RendezvousError(f"ray_world: only {len(joined)} of {n} ranks reached the store of rank 0 "
                                  f"within {timeout:g} s")
        world.nodes = _results(world.gather(joins))
    except BaseException:
        world.shutdown()
        raise
    return world


def _results(outcomes: list[Any]) -> list[Any]:
    """The outcomes, or the first rank's error among them raised."""
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return outcomes


def _outcomes(refs: list[ray.ObjectRef]) -> list[Any]:
    """Each of ``refs``' value, or its Ray error: a rank that died or failed has
    nothing left to close or report."""
    outcomes: list[Any] = []
    for ref in refs:
        try:
            outcomes.append(ray.get(ref))
        except (RayTaskError, RayActorError) as exc:
            outcomes.append(exc)
    return outcomes


def _translate(exc: RayTaskError | RayActorError, rank: int) -> BaseException:
    """A rank's failure as the driver should see it: its own exception, or
    PeerLostError for an actor that died."""
    if isinstance(exc, RayActorError):
        why = (str(exc).strip().splitlines() or [""])[0]  # Ray's first line; the rest is the actor's ids
        lost = PeerLostError(f"rank {rank} of the Ray world was lost: its actor died ({type(exc).__name__}: {why})",
                             rank)
        lost.__cause__ = exc
        return lost
    cause = exc.cause
    if isinstance(cause, BaseException):
        return cause
    return exc

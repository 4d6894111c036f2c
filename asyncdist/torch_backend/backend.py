"""The backend's creator: from what torch passes to a running asyncdist group.

torch calls :func:`create_backend` once per process group whose backend is
``"asyncdist"``: for ``init_process_group`` and for every ``new_group``,
on the member ranks only, with a store already prefixed for that group
(``"<group name>/cpu/"`` over the job's store), the rank and size within the
group, and the timeout.

Each torch group is its own asyncdist world, bootstrapped over that store
(:func:`asyncdist.init_world` with a :class:`~asyncdist.rendezvous.torch_store.TorchStore`):
its own engine and connections, with the group's ranks as the world's ranks.
Subgroups cannot share the default group's engine, because asyncdist numbers
a group's message contexts by the order in which *every* rank creates groups
(:mod:`asyncdist.group.subgroups`), and torch never calls the creator on the
ranks outside a new group, so those ranks could not keep count. A world per
group needs no such agreement, at the cost of one connection per pair of
members per group.

Under a launcher that serves the store (torchrun, asyncdist-run) the store
outlives a failed attempt, and torch 2.13's env:// does not scope it per
attempt, so a restarted process would find its rank already claimed by the
last attempt. The keys therefore also go under the attempt,
``TORCHELASTIC_RESTART_COUNT`` (0 when unset), read when the group is created.

Every group of the process lives on one :class:`~asyncdist.loop.thread.LoopThread`,
started by the first group and stopped when the last one is shut down
(``destroy_process_group``). :data:`_runtime` is the one object that holds it.
:func:`create_group` is the part that does not need torch's registry: it
makes a group from a store, a rank and a size, for the creator and for
torchft's reconfigurable group (:mod:`asyncdist.torchft`), which makes one
per quorum.

Thread affinity: torch calls the creator from the thread that creates the
group; it blocks until every member has joined (as torch's own backends do).
Groups may be created and shut down from several threads at once (torchft
configures from its quorum thread): the runtime's lock keeps one loop thread.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import torch.distributed as tdist

from .. import settings
from ..errors import InvalidArgumentError
from ..loop.thread import LoopThread
from ..rendezvous.torch_store import TorchStore
from ..group.world import init_world
from .process_group import AsyncdistProcessGroup

__all__ = ["create_backend", "create_group"]


class _Runtime:
    """The backend's state for this process: the loop thread and its groups."""

    def __init__(self) -> None:
        self.portal: LoopThread | None = None
        self.groups: set[AsyncdistProcessGroup] = set()
        # torch reuses group names after destroy_process_group ("0" is always
        # the default group's); counting creations per name keeps each
        # incarnation's keys apart in a store that outlives it (torchrun's).
        self.created: dict[str, int] = {}
        # Held while the loop thread is made, or stopped with the group set empty;
        # also counts the groups being made, which keep the loop thread too.
        self._lock = threading.Lock()
        self._making = 0

    def loop_thread(self) -> LoopThread:
        """The loop thread, started if there is none; pair with :meth:`made`."""
        with self._lock:
            self._making += 1
            if self.portal is None:
                self.portal = LoopThread(name="asyncdist-torch-loop")
            return self.portal

    def made(self, group: AsyncdistProcessGroup | None) -> None:
        """A group began with :meth:`loop_thread` is made (None: it failed)."""
        with self._lock:
            self._making -= 1
            if group is not None:
                self.groups.add(group)
        if group is None:
            self.stop_if_idle()

    def add(self, group: AsyncdistProcessGroup) -> None:
        with self._lock:
            self.groups.add(group)

    def forget(self, group: AsyncdistProcessGroup) -> None:
        with self._lock:
            self.groups.discard(group)
        self.stop_if_idle()

    def stop_if_idle(self) -> None:
        with self._lock:
            if self.groups or self._making or self.portal is None:
                return
            portal, self.portal = self.portal, None
        portal.stop()


_runtime = _Runtime()


def _attempt() -> str:
    """The launcher's restart attempt (``TORCHELASTIC_RESTART_COUNT``), ``"0"`` without one."""
    return settings.current().environ.get("TORCHELASTIC_RESTART_COUNT", "").strip() or "0"


def create_backend(options: Any, backend_options: Any = None) -> AsyncdistProcessGroup:
    """Join the group torch is creating and return its ProcessGroup (blocking).

    Args:
        options: torch's ``_DistributedBackendOptions`` (``store``,
            ``group_rank``, ``group_size``, ``timeout``, ``group_id``,
            ``global_ranks_in_group``); torch passes it because the backend is
            registered with ``extended_api=True``.
        backend_options: ``pg_options`` of ``init_process_group`` / ``new_group``;
            asyncdist has none, so it must be None.

    Raises:
        InvalidArgumentError: ``backend_options`` were given.
        RendezvousError: the members could not connect (see :func:`asyncdist.init_world`).
    """
    if backend_options is not None:
        raise InvalidArgumentError(f"the asyncdist backend takes no pg_options, got {backend_options!r}")
    name = str(options.group_id)
    generation = _runtime.created.get(name, 0)
    _runtime.created[name] = generation + 1
    members = list(options.global_ranks_in_group)  # empty for the default group
    return create_group(
        options.store,
        options.group_rank,
        options.group_size,
        options.timeout,
        group_name=f"torch:{name}" + (f" (global ranks {members})" if members else ""),
        store_prefix=f"asyncdist/attempt_{_attempt()}/{generation}",
    )


def create_group(
    store: tdist.Store, rank: int, world_size: int, timeout: timedelta, *, group_name: str, store_prefix: str
) -> AsyncdistProcessGroup:
    """Make an asyncdist group of ``world_size`` processes over a torch store (blocking).

    Each member calls it with its own ``rank``; it returns once every member
    has joined. The group is a world of its own (see the module docstring)
    and lives on the process's loop thread until it is shut down.

    Args:
        store: a torch ``Store`` that every member reaches (a ``PrefixStore``
            scoped to this group, as torch and torchft pass).
        rank: this process's rank in the group, ``0 <= rank < world_size``.
        world_size: the number of members.
        timeout: how long to wait for the members, and every operation's timeout.
        group_name: the name that error messages give the group.
        store_prefix: where under ``store`` the group's keys go.

    Raises:
        RendezvousError: the members could not connect (see :func:`asyncdist.init_world`).
        InvalidArgumentError: ``rank`` or ``world_size`` is out of range.
    """
    portal = _runtime.loop_thread()
    group: AsyncdistProcessGroup | None = None
    try:
        world = portal.run(
            init_world(
                store=TorchStore(store),
                rank=rank,
                world_size=world_size,
                timeout=timeout,
                group_name=group_name,
                store_prefix=store_prefix,
            ),
            what="creating an asyncdist process group",
        )
        group = AsyncdistProcessGroup(world, portal, _runtime.forget, _runtime.add)
    finally:
        _runtime.made(group)
    return group

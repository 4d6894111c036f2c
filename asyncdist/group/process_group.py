"""``ProcessGroup``: the await API of a set of ranks, composed of explicit parts.

A group is assembled from parts, each with its own state, none reading
another's private attributes:

* :class:`~.members.Members`: who is in the group, rank translation, the
  one check of a rank argument;
* :class:`~.calls.Calls`: contexts, call numbers, reservations, timeouts;
* :class:`~.p2p.PointToPoint`, :class:`~.collectives.Collectives`,
  :class:`~.objects.ObjectCollectives`, :class:`~.monitor.Monitor`: the
  operations;
* :class:`~.devices.Devices`: where operations with device operands go;
* :class:`~.subgroups.Subgroups`: the groups made from this one;
* :class:`~.fault.FaultTolerance`: ``failed_ranks``, ``revoke``, ``agree``, ``shrink``.

ProcessGroup's methods are those parts' methods; a collective first asks
whether an operand lives on a device. Loop thread only: the ``i*`` methods
start an operation and return a :class:`~asyncdist.group.work.Work` at
once; the ``async`` methods complete it.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Coroutine, Sequence

from ..engine.channel import Channel
from ..engine.engine import Engine
from ..gpu.device import HOST_TYPES, any_device
from ..rendezvous.store import Store
from ..flight.descriptions import Description
from .calls import CallReservation, Calls
from .closers import Closers
from .collectives import Collectives
from .devices import Devices
from .forwarding import completion, host_or_device, objects_of
from .fault import FaultTolerance
from .growth import grow
from .members import Members
from .monitor import Monitor
from .objects import ObjectCollectives
from . import observing
from .p2p import PointToPoint
from .subgroups import Subgroups
from .work import Work

if TYPE_CHECKING:  # imported where a group is given NCCL (asyncdist.gpu.use_nccl)
    from ..gpu.nccl import NcclBackend

__all__ = ["ProcessGroup"]

class ProcessGroup:
    """A set of ranks that communicate; the world or a subgroup.

    Args:
        engine: this rank's engine.
        ranks: the global ranks of the members, in group-rank order.
        name: the group's name, for error messages.
        timeout: seconds every operation of this group may take.
        first_call: the number of its first collective call (the world's
            startup barrier is call #0, so that the user's first is #1).
        contexts: where its message contexts come from (None: the engine's counter).

    Attributes:
        rank: this process's rank in the group, -1 if it is not a member.
        size: the number of members.
        ranks: the members' global ranks.
        name: as given.
        engine: this rank's engine (shared by every group of the job).
        members, calls: the group's membership and its calls' bookkeeping.
        store: the store the members share (where NCCL unique ids travel), or None.
    """

    def __init__(self, engine: Engine, ranks: Sequence[int], *, name: str, timeout: float, first_call: int = 1,
                 contexts: Callable[[], int] | None = None) -> None:
        self.engine = engine
        self.members = Members(ranks, engine.rank, name)
        self.ranks, self.rank, self.size = self.members.ranks, self.members.rank, self.members.size
        self.name = name
        self.calls = Calls(engine, self.members, timeout, first_call, contexts)
        self.p2p = PointToPoint(self.calls)
        self.collectives = Collectives(self.calls)
        self.devices = Devices(self.calls, self.p2p)
        self.objects = ObjectCollectives(self)
        self.monitor = Monitor(self.calls)
        self.subgroups: Subgroups[ProcessGroup] = Subgroups(self.calls, self._child)
        self.faults: FaultTolerance[ProcessGroup] = FaultTolerance(self.calls, self._child)
        self.store: Store | None = None
        self._closers = Closers()

    def __repr__(self) -> str:
        return f"<ProcessGroup {self.name!r} rank {self.rank}/{self.size}>"

    @property
    def timeout(self) -> float:
        """Seconds every operation of this group may take (settable; later operations use the new value)."""
        return self.calls.timeout

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        self.calls.timeout = seconds

    @property
    def nccl(self) -> NcclBackend | None:
        """The group's :class:`~asyncdist.gpu.nccl.NcclBackend`, or None (device operands are staged)."""
        return self.devices.nccl

    @nccl.setter
    def nccl(self, backend: NcclBackend | None) -> None:
        self.devices.nccl = backend

    # -- ranks -------------------------------------------------------------------------

    def global_rank(self, group_rank: int) -> int:
        """The global rank of member ``group_rank``.

        Raises:
            InvalidRankError: not a rank of this group.
        """
        return self.members.global_rank(group_rank)

    def group_rank(self, global_rank: int) -> int:
        """The group rank of global rank ``global_rank``.

        Raises:
            InvalidRankError: that rank is not a member.
        """
        return self.members.group_rank(global_rank)

    # -- point to point --------------------------------------------------------------

    def isend(self, tensor: Any, dst: int, tag: int = 0) -> Work:
        """Start sending ``tensor`` to group rank ``dst``; the Work completes when
        the buffer may be reused."""
        if type(tensor) not in HOST_TYPES and any_device((tensor,)):  # (a NumPy array: no call)
            return self.devices.isend(tensor, dst, tag)
        return self.p2p.isend(tensor, dst, tag)

    def send(self, tensor: Any, dst: int, tag: int = 0) -> Coroutine[Any, Any, None]:
        """Send ``tensor`` to group rank ``dst``; returns when the buffer may be reused.

        Raises:
            InvalidRankError: ``dst`` is out of range or this rank.
            UnsupportedBufferError: ``tensor`` is not a contiguous CPU array.
            PeerLostError: ``dst`` is gone.
            OperationTimeoutError: not sent within the group's timeout.
        """
        if type(tensor) not in HOST_TYPES and any_device((tensor,)):  # (a NumPy array: no call)
            return completion(lambda: self.devices.isend(tensor, dst, tag))
        return self.p2p.send(tensor, dst, tag)  # its coroutine, not one around it: one await less

    def irecv(self, tensor: Any, src: int | None = None, tag: int = 0) -> Work:
        """Start receiving into ``tensor``; the Work's value is the sender's group rank."""
        if type(tensor) not in HOST_TYPES and any_device((tensor,)):  # (a NumPy array: no call)
            return self.devices.irecv(tensor, src, tag)
        return self.p2p.irecv(tensor, src, tag)

    def recv(self, tensor: Any, src: int | None = None, tag: int = 0) -> Coroutine[Any, Any, int]:
        """Receive into ``tensor`` from group rank ``src`` (any rank if None).

        Returns:
            the sender's group rank.

        Raises:
            BufferMismatchError: the message's dtype or element count differs
                from ``tensor``'s (the message is consumed).
            PeerLostError, OperationTimeoutError: as for :meth:`send`.
        """
        if type(tensor) not in HOST_TYPES and any_device((tensor,)):  # (a NumPy array: no call)
            return completion(lambda: self.devices.irecv(tensor, src, tag))
        return self.p2p.recv(tensor, src, tag)

    # -- collectives -------------------------------------------------------------------

    barrier = host_or_device(Collectives.barrier)
    broadcast = host_or_device(Collectives.broadcast)
    all_reduce = host_or_device(Collectives.all_reduce)
    all_reduce_coalesced = host_or_device(Collectives.all_reduce_coalesced)
    reduce = host_or_device(Collectives.reduce)
    all_gather = host_or_device(Collectives.all_gather)
    all_gather_into_tensor = host_or_device(Collectives.all_gather_into_tensor)
    all_gather_into_tensor_coalesced = host_or_device(Collectives.all_gather_into_tensor_coalesced)
    gather = host_or_device(Collectives.gather)
    scatter = host_or_device(Collectives.scatter)
    reduce_scatter = host_or_device(Collectives.reduce_scatter)
    reduce_scatter_tensor = host_or_device(Collectives.reduce_scatter_tensor)
    reduce_scatter_tensor_coalesced = host_or_device(Collectives.reduce_scatter_tensor_coalesced)
    all_to_all = host_or_device(Collectives.all_to_all)
    all_to_all_single = host_or_device(Collectives.all_to_all_single)

    broadcast_object_list = objects_of(ObjectCollectives.broadcast_object_list)
    all_gather_object = objects_of(ObjectCollectives.all_gather_object)
    gather_object = objects_of(ObjectCollectives.gather_object)
    scatter_object_list = objects_of(ObjectCollectives.scatter_object_list)
    send_object_list = objects_of(ObjectCollectives.send_object_list)
    recv_object_list = objects_of(ObjectCollectives.recv_object_list)

    async def monitored_barrier(self, timeout: timedelta | float | None = None, wait_all_ranks: bool = False) -> None:
        """Return once every member has entered; otherwise fail, naming who did not.

        See :meth:`asyncdist.group.monitor.Monitor.monitored_barrier`.
        """
        await self.monitor.monitored_barrier(timeout, wait_all_ranks)

    def channel(self, op: Description | str) -> Channel:
        """Open the channel of the next collective call; ``op`` describes the call
        (:func:`asyncdist.flight.descriptions.describe`, or a name of your own).

        For algorithms of your own: every member must make its collective
        calls in the same order, the n-th call of each rank matched with
        the n-th of the others.
        """
        return self.calls.channel(op)

    def reserve_calls(self, count: int) -> CallReservation:
        """Number this rank's next ``count`` collective calls of the group now
        (for device staging; see :meth:`asyncdist.group.calls.Calls.reserve`)."""
        return self.calls.reserve(count)

    # -- subgroups ----------------------------------------------------------------------

    def new_group(
        self, ranks: Sequence[int] | None = None, *, timeout: timedelta | float | None = None, name: str | None = None
    ) -> ProcessGroup:
        """Create a group of some of this group's ranks (a plain call: nothing is sent).

        Loop thread only. Every rank of the job, member or not, must create
        the same groups in the same order.

        Args:
            ranks: the members, as ranks of *this* group, in the new group's
                rank order (None: all of this group's ranks).
            timeout: seconds (or a ``timedelta``) every operation of the new
                group may take; None: this group's timeout.
            name: the new group's name in error messages.

        Returns:
            The new group; its ``rank`` is -1 on ranks that are not members.

        Raises:
            InvalidRankError: a rank is not an int in ``[0, size)``.
            InvalidArgumentError: ``ranks`` repeats a rank, or ``timeout`` is not positive.

        Example::

            pair = world.new_group([0, 1])
            if pair.rank >= 0:
                await pair.all_reduce(x)
        """
        return self.subgroups.new_group(ranks, timeout=timeout, name=name)

    def partition(
        self, parts: Sequence[Sequence[int]], *, timeout: timedelta | float | None = None, name: str | None = None
    ) -> tuple[ProcessGroup | None, list[ProcessGroup]]:
        """One group per list of this group's ranks (a plain call: nothing is sent).

        Every rank calls it with the same lists. Ranks in no list are in no group.

        Returns:
            ``(mine, groups)``: the group this rank is in (None if none) and every group.

        Raises:
            InvalidArgumentError: ``parts`` is empty, or two lists share a rank.
            InvalidRankError: as for :meth:`new_group`.
        """
        return self.subgroups.partition(parts, timeout=timeout, name=name)

    async def split(
        self, color: int | None, key: int = 0, *, timeout: timedelta | float | None = None, name: str | None = None
    ) -> ProcessGroup | None:
        """MPI's ``MPI_Comm_split``: the ranks that pass one ``color`` form a group.

        A collective call of this group: every member calls it. Within a new group,
        ranks are ordered by ``key``, then by their rank here. Offered on groups of
        every rank of the job; split a smaller group with :meth:`partition`.

        Args:
            color: a non-negative int; None (MPI's ``MPI_UNDEFINED``) joins no group.
            key: the rank order within the new group.
            timeout, name: as for :meth:`new_group`.

        Returns:
            This rank's new group, or None for ``color=None``.

        Raises:
            InvalidArgumentError: ``color`` is negative or not an int, or this
                group does not hold every rank of the job.
        """
        return await self.subgroups.split(self.all_gather_into_tensor, color, key, timeout=timeout, name=name)

    def _child(
        self, ranks: list[int], name: str, timeout: float, contexts: Callable[[], int] | None = None
    ) -> ProcessGroup:
        child = ProcessGroup(self.engine, ranks, name=name, timeout=timeout, contexts=contexts)
        child.store = self.store
        return child

    # -- fault tolerance (see asyncdist.group.fault) ---------------------------------------

    def failed_ranks(self) -> list[int]:
        """The group ranks known lost, sorted: those the last ``agree`` or ``shrink``
        counted as failed, and those this rank has seen crash or be expelled since."""
        return self.faults.failed_ranks()

    async def revoke(self) -> None:
        """Fail every pending and later operation of this group, on every live member,
        with :class:`~asyncdist.errors.GroupRevokedError` (``agree`` and ``shrink`` still work)."""
        await self.faults.revoke()

    async def agree(self, flag: int, *, timeout: timedelta | float | None = None) -> int:
        """Fault-tolerant agreement (docs/fault-tolerance.md): the bitwise AND of ``flag``
        over the live members, the same on each, which then see the same :meth:`failed_ranks`.
        Works on a revoked group; members call ``agree`` and ``shrink`` in the same order.
        Raises RankExcludedError (the others count this rank as failed) or
        OperationTimeoutError (no decision within ``timeout``; None: the group's)."""
        return await self.faults.agree(flag, timeout=timeout)

    async def shrink(self, *, exclude: Sequence[int] = (), timeout: timedelta | float | None = None) -> ProcessGroup:
        """The group of the members not counted as failed, agreed even if another
        dies meanwhile, ranks renumbered in the old order; after :meth:`revoke` or
        without. ``exclude``: group ranks to count as failed though they may live
        (they are expelled from the job). The new group takes over what this one
        owns (the world: the engine): close it, not this one. Raises as :meth:`agree`."""
        group = await self.faults.shrink(exclude=exclude, timeout=timeout)
        self.pass_on(group)
        return group

    async def grow(self, *, timeout: timedelta | float | None = None, min_joiners: int = 0) -> ProcessGroup:
        """Admit the processes waiting to join (``init_world(..., join=True)``); return the
        bigger group, or this same one when nobody waits: see :func:`asyncdist.group.growth.grow`."""
        return await grow(self, type(self), timeout=timeout, min_joiners=min_joiners)

    def pass_on(self, successor: ProcessGroup) -> None:
        """Give ``successor`` (shrunk or grown) what closing this group would release (the engine)."""
        self._closers.hand_to(successor._closers)

    # -- observing ----------------------------------------------------------------------

    def dump_trace(self, path: str | os.PathLike[str] | None = None) -> Path:
        """Write this rank's flight recorder (:func:`.observing.dump_trace`); return the file."""
        return observing.dump_trace(self.engine, path)

    def stats(self, reset: bool = False) -> dict[str, Any]:
        """Bytes and messages per member, operations by kind, time in them (:func:`.observing.stats`)."""
        return observing.stats(self.calls, reset=reset)

    # -- lifetime -----------------------------------------------------------------------

    def on_close(self, closer: Callable[[], Any]) -> None:
        """Run ``closer`` (a function or coroutine function) when the group closes."""
        self._closers.add(closer)

    async def close(self) -> None:
        """Release what this group owns (for the world group: the engine and store).

        Every closer runs, newest first, even when one fails; the first
        failure is raised after the last closer.
        """
        self.faults.close()
        await self._closers.run()

    async def __aenter__(self) -> ProcessGroup:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

"""``ProcessGroupAsyncdist``: torchft's reconfigurable process group, over asyncdist.

torchft's ``Manager`` asks its process group for four things, and this
class answers each on asyncdist:

* ``configure(store_addr, replica_id, rank, world_size, quorum_id,
  group_rank, group_world_size, global_ranks)``, called from the Manager's
  quorum thread each time the quorum changes: ``store_addr`` is
  ``host:port/prefix`` of a TCPStore under a prefix that is new for each
  quorum (``torchft/<quorum_id>/<group_rank>``). As torchft's own
  ``ProcessGroupGloo`` does, the class builds on torchft's
  ``ProcessGroupWrapper``, whose ``configure`` aborts the last group, opens
  a client of that store and calls :meth:`ProcessGroupAsyncdist._create_pg`;
  here that makes a fresh asyncdist world over the store
  (:func:`asyncdist.torch_backend.backend.create_group`), one per quorum,
  with the replicas as its ranks.
* the collectives (``allreduce`` for DDP's gradients and the Manager's own),
  which the wrapper hands to the group underneath
  (:class:`~asyncdist.torch_backend.process_group.AsyncdistProcessGroup`);
  each Work comes back as a :class:`~.work.TorchftWork`, whose ``wait``
  reports a failure the way the Manager expects (see :mod:`.work`), and is
  kept here until it ends, for the next two.
* ``errored()``, which the Manager reads in ``should_commit`` before it
  commits a step: the first error of an operation of the current group
  (a :class:`~asyncdist.errors.PeerLostError` naming the lost replica's rank,
  when one died), or the abort's; None while the group is healthy.
* ``abort()``: every operation still outstanding fails at once. One that
  waits on a peer fails with a :class:`~asyncdist.errors.PeerLostError`
  naming that rank: the peer is dropped from the group's world, as its
  heartbeat would drop it had it gone silent, so that nothing waits out a
  timeout. The group is then revoked (the other members' operations on it
  fail too, at once) and closed. torchft's ``ProcessGroupGloo`` cannot do
  this: gloo has no abort, so its operations run until gloo's timeout.

Thread affinity: any thread but the asyncdist loop's own; ``configure``
runs on the Manager's quorum thread while the training thread may use the
last group, which is why the outstanding Works are kept under a lock.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from typing import Any

from torch.distributed import AllreduceOptions, ReduceOp, Store
from torchft.process_group import ProcessGroupWrapper

from ..errors import AsyncDistError, ClosedError, PeerLostError
from ..group.process_group import ProcessGroup
from ..torch_backend.backend import create_group
from ..torch_backend.process_group import AsyncdistProcessGroup
from .work import TorchftWork

__all__ = ["ProcessGroupAsyncdist", "BACKEND_NAME"]

#: What ``getBackendName()`` says (torchft's own are "torchft-gloo", "torchft-nccl").
BACKEND_NAME = "torchft-asyncdist"

#: How long abort waits for the failed operations to finish failing before it
#: closes the group (a bound, not a wait: they fail within a few loop turns).
_ABORT_SETTLE_SECONDS = 5.0


class ProcessGroupAsyncdist(ProcessGroupWrapper):
    """torchft's process group over asyncdist: a fresh asyncdist group per quorum.

    Args:
        timeout: how long ``configure`` waits for the quorum's members to
            connect, and every operation's timeout (torchft's default, 60 s).

    Example::

        from torchft import Manager
        from asyncdist.torchft import ProcessGroupAsyncdist

        manager = Manager(pg=ProcessGroupAsyncdist(timedelta(seconds=10)), min_replica_size=2,
                          load_state_dict=model.load_state_dict, state_dict=model.state_dict)
    """

    _pg: AsyncdistProcessGroup | None  # the current quorum's group (torchft's wrapper's attribute)

    def __init__(self, timeout: timedelta = timedelta(seconds=60)) -> None:
        super().__init__(timeout=timeout)
        self._lock = threading.Lock()
        self._works: list[TorchftWork] = []
        self._error: Exception | None = None

    def __repr__(self) -> str:
        return f"ProcessGroupAsyncdist(pg={self._pg!r})"

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return BACKEND_NAME

    # -- a group per quorum ---------------------------------------------------------

    def configure(
        self,
        store_addr: str,
        replica_id: str,
        rank: int,
        world_size: int,
        quorum_id: int | None = None,
        group_rank: int | None = None,
        group_world_size: int | None = None,
        global_ranks: list[int] | None = None,
    ) -> None:
        """Replace the group with a new one of the quorum ``store_addr`` names (blocking).

        Called by torchft's Manager at each new quorum, with the arguments of
        torchft's ``ProcessGroup.configure``; ``rank`` and ``world_size`` are
        this replica's rank in the quorum and the quorum's size. The last
        group is aborted first (its outstanding operations fail, see
        :meth:`abort`), and :meth:`errored` is None again.

        Raises:
            RendezvousError: the quorum's members did not all connect within the timeout.
            DistStoreError: the store at ``store_addr`` could not be reached (torch's).
        """
        # torchft's own, unchanged (it calls abort and _create_pg); overridden for this docstring.
        super().configure(
            store_addr, replica_id, rank, world_size, quorum_id, group_rank, group_world_size, global_ranks
        )

    def _create_pg(self, store: Store, rank: int, world_size: int) -> AsyncdistProcessGroup:
        """The quorum's asyncdist group over ``store`` (already prefixed for the quorum).

        torchft's ``configure`` calls it after aborting the last group and
        before it sets the new one: the last group's Works and error are
        forgotten here, while no operation can start (``parent`` raises), so
        that none of the new group's is forgotten with them.
        """
        with self._lock:
            self._works.clear()
            self._error = None
        return create_group(
            store,
            rank,
            world_size,
            self._timeout,
            group_name=f"torchft quorum {self._quorum_id}",
            store_prefix="asyncdist",
        )

    @property
    def parent(self) -> AsyncdistProcessGroup:
        """The current quorum's group.

        Raises:
            ClosedError: there is none (never configured, or aborted or shut down since).
        """
        pg = self._pg
        if pg is None:
            raise ClosedError("ProcessGroupAsyncdist has no process group: configure() it (torchft's "
                              "Manager does at each quorum); it was never configured, or aborted or shut down")
        return pg

    def _opts_hook(self, opts: Any) -> Any:
        """The options torchft's wrapper hands on to each operation: a bare
        ``ReduceOp`` (``pg.allreduce([t], ReduceOp.SUM)``, which torchft's own
        groups take, as torch's C++ bindings do) becomes the options struct
        the asyncdist backend reads its reduction from."""
        if isinstance(opts, ReduceOp):
            options = AllreduceOptions()
            options.reduceOp = opts
            return options
        return opts

    def _wrap_work(self, work: Any, opts: object) -> TorchftWork:
        """Each operation's Work, as torchft waits on it; kept until it ends (for
        :meth:`errored` and :meth:`abort`)."""
        wrapped = TorchftWork(work)
        with self._lock:
            self._collect()
            self._works.append(wrapped)
        return wrapped

    def _collect(self) -> None:
        """Drop the Works that ended, keeping the first error among them (lock held).

        A cancelled operation (its loop thread stopped) counts as failed, as a
        ClosedError: its tensors were not reduced, and the step must not commit.
        """
        running = []
        for work in self._works:
            if not work.is_completed():
                running.append(work)
            elif self._error is None and (error := work.exception()) is not None:
                self._error = error if isinstance(error, Exception) else ClosedError(str(error))
        self._works = running

    # -- errors -----------------------------------------------------------------------

    def errored(self) -> Exception | None:
        """The error that makes the current group unusable, or None while it is healthy.

        The first error of an operation of this group (an asyncdist error such
        as :class:`~asyncdist.errors.PeerLostError`, whose ``rank`` is the lost
        replica's rank in the quorum), or the one :meth:`abort` failed the
        outstanding operations with. None again after :meth:`configure`.
        """
        with self._lock:
            self._collect()
            return self._error

    def abort(self, errored: bool = True) -> None:
        """Fail every outstanding operation at once, then close the group (blocking, briefly).

        An operation still waiting on a peer fails with a
        :class:`~asyncdist.errors.PeerLostError` naming that rank; the rest
        fail as the group is revoked (the other members' operations on it fail
        too). torchft's ``configure`` calls ``abort(errored=False)`` before
        making the next quorum's group; with ``errored=True`` (the default)
        :meth:`errored` then reports the error. Idempotent. The group is
        closed and forgotten even if failing its operations raised (the
        error is then raised after), so that the next ``configure`` starts
        afresh.
        """
        pg = self._pg
        try:
            if pg is not None:
                with self._lock:
                    works = list(self._works)
                error = pg.loop_thread.run(_fail_outstanding(pg.asyncdist_group, works),
                                           what="ProcessGroupAsyncdist.abort()")
                if errored:
                    with self._lock:
                        self._collect()
                        self._error = self._error or error
        finally:
            super().abort(errored)  # logs to torchft's error log, closes the group (pg.abort) and forgets it

    def shutdown(self) -> None:
        """Close the group, if there is one (peers still waiting on this rank get
        PeerLostError); it can be configured again afterwards."""
        pg, self._pg = self._pg, None
        if pg is not None:
            pg.shutdown()


async def _fail_outstanding(group: ProcessGroup, works: list[TorchftWork]) -> AsyncDistError:
    """Fail ``works``, the group's outstanding operations, and revoke the group (loop thread).

    Returns:
        The error that names why: the first PeerLostError made for a peer that
        an operation waited on, else one for a rank already known lost, else a
        ClosedError.
    """
    # One turn of the loop first: an operation started just before has then taken
    # its first step (tasks start in order), opened its call and can say whom it awaits.
    await asyncio.sleep(0)
    me = group.rank
    lost = set(group.failed_ranks())
    awaited: dict[int, str] = {}  # group rank -> the first operation that waits on it
    for work in works:
        waiting = work.waiting()
        if waiting is not None:
            where, peers = waiting
            for peer in (*peers.receiving, *peers.sending):
                awaited.setdefault(peer, where)
    named: AsyncDistError | None = None
    for peer, where in sorted(awaited.items()):
        if peer in lost:
            continue
        error = PeerLostError(f"rank {me}: {where} was aborted (torchft) while it waited for rank {peer}", peer)
        reason = f"rank {me} aborted group {group.name!r} (torchft) while it waited for this rank"
        group.engine.faults.expel(group.global_rank(peer), reason, error)
        named = named or error
    await group.revoke()
    futures = [f for f in (work.future for work in works) if f is not None and not f.done()]
    if futures:
        await asyncio.wait(futures, timeout=_ABORT_SETTLE_SECONDS)
    if named is not None:
        return named
    if lost:
        first = min(lost)
        return PeerLostError(f"rank {me}: group {group.name!r} was aborted (torchft) after rank {first} was lost", first)
    return ClosedError(f"rank {me}: group {group.name!r} was aborted (torchft)")

"""The blocking facade's lifecycle: init, destroy, and the process's one state.

``import asyncdist as dist`` gives torch.distributed's functions, with its
names, arguments and in-place semantics, so a script written for
torch.distributed runs after changing its import. The facade holds no
communication logic: each call runs the group's method on the
:class:`~asyncdist.loop.thread.LoopThread` and waits for its
:class:`~asyncdist.group.work.Work` (``async_op``-style calls return the Work).

Everything the facade keeps for the process lives in one object,
:data:`_runtime`: the loop thread, the world group and the backend name.
``destroy_process_group`` closes every socket and stops the thread, after
which ``init_process_group`` may be called again.
"""

from __future__ import annotations

import os
import signal
import sys

from datetime import timedelta
from typing import Any

from .. import settings
from .backends import parse_backend
from ..flight.dumps import install_sigusr1
from ..errors import AlreadyInitializedError, InvalidArgumentError, NotInitializedError
from ..group.process_group import ProcessGroup
from ..loop.exits import call_at_exit, call_on_termination
from ..loop.thread import LoopThread
from ..rendezvous.store import Store
from ..rendezvous.store_threads import STORE_EXECUTOR
from ..group.world import init_world

__all__ = [
    "Group",
    "NON_GROUP_MEMBER",
    "init_process_group",
    "destroy_process_group",
    "is_initialized",
    "is_available",
    "get_backend",
    "get_backend_config",
    "get_pg_count",
    "get_rank",
    "get_world_size",
]

#: What ``new_group`` returns on ranks outside the new group, as torch does
#: (``GroupMember.NON_GROUP_MEMBER``); every facade call accepts it as ``group``.
NON_GROUP_MEMBER = -100

#: What every facade call takes as ``group``: a group, NON_GROUP_MEMBER, or None (the world).
Group = ProcessGroup | int | None

class _Runtime:
    """The facade's state for this process: one object, not scattered globals."""

    def __init__(self) -> None:
        self.portal: LoopThread | None = None
        self.world: ProcessGroup | None = None
        self.backend: str | None = None
        self.generation = 0  # how many times init_process_group succeeded
        self.exit_hook_pid: int | None = None  # the process that registered _close_at_exit


_runtime = _Runtime()


def _close_at_exit() -> None:
    """Destroy the default group of a script that ends without doing so
    (torch's tutorial scripts do): peers then see an orderly goodbye, not a
    crash that fails their collectives still in flight. A script ended by
    Ctrl-C says so in its goodbye, and its peers' errors read "rank 1 was
    interrupted (SIGINT)"."""
    # The interpreter keeps the exception that ended the script in
    # sys.last_value (sys.last_exc from 3.12) before the exit hooks run.
    ended_by = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    _say_goodbye(signal.SIGINT if isinstance(ended_by, KeyboardInterrupt) else 0)


def _say_goodbye(signum: int) -> None:
    """Destroy the default group, if any, telling the peers the signal that
    ends this process (0: none): on SIGTERM they read "rank 1 was terminated
    (SIGTERM)" (:func:`~asyncdist.loop.exits.call_on_termination`)."""
    world = _runtime.world
    if world is not None:
        world.engine.farewell_signal = signum
        destroy_process_group()


def _check_backend(backend: Any) -> str:
    return parse_backend(backend).name


def _use_backend(group: ProcessGroup, backend: Any, store: Store | None) -> None:
    """Loop thread: send ``group``'s CUDA operands through NCCL if ``backend`` says so."""
    if parse_backend(backend).cuda == "nccl":
        from ..gpu import use_nccl  # the NCCL module itself imports CuPy only when used

        use_nccl(group, store)


def init_process_group(
    backend: str | None = None,
    init_method: str | None = None,
    timeout: timedelta | None = None,
    world_size: int = -1,
    rank: int = -1,
    store: Store | None = None,
    group_name: str = "",
    pg_options: Any = None,
    device_id: Any = None,
) -> None:
    """Initialize the default process group (blocks until every rank has joined).

    Args:
        backend: ``None``, ``"gloo"`` or ``"asyncdist"`` (CPU tensors, and CUDA
            tensors through pinned staging); ``"nccl"`` or a map such as
            ``"cpu:gloo,cuda:nccl"`` (CUDA tensors through NCCL, which needs
            CuPy). See :mod:`asyncdist.facade.backends` and ``docs/gpu.md``.
        init_method: ``"env://"`` (default: ``MASTER_ADDR``, ``MASTER_PORT``,
            ``RANK``, ``WORLD_SIZE``), ``"tcp://host:port"`` or ``"file:///path"``.
            Mutually exclusive with ``store``.
        timeout: bound on the rendezvous and on every operation (default 30 min).
        world_size, rank: required unless given by the environment (env://).
        store: a key-value store (``TCPStore``, ``FileStore``, …) all ranks share.
        group_name: the world group's name in error messages.
        pg_options, device_id: accepted for torch compatibility; unused on CPU.

    With ``ASYNCDIST_JOIN=1`` in the environment (``asyncdist-run --replace``
    sets it) the process joins the job already running at ``init_method``
    instead: it needs neither rank nor world size, and returns once the
    job's ranks call :func:`~asyncdist.facade.elastic.grow_group`, with the next rank.

    Raises:
        AlreadyInitializedError: called twice without ``destroy_process_group``.
        RendezvousError: missing environment variables, duplicate ranks, world
            size mismatch, unreachable store or ranks (the message says which).
        InvalidRankError: ``rank`` not in ``[0, world_size)``.

    Example::

        import asyncdist as dist
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29500", rank=r, world_size=2)
    """
    if _runtime.world is not None:
        raise AlreadyInitializedError("trying to initialize the default process group twice!")
    name = _check_backend(backend)
    portal = LoopThread()
    try:
        world = portal.run(
            init_world(
                init_method,
                rank=rank,
                world_size=world_size,
                store=store,
                timeout=timeout,
                group_name=group_name,
                store_prefix=f"asyncdist/{_runtime.generation}",
                join=settings.refresh().join,
            ),
            what="init_process_group()",
        )
        portal.call(_use_backend, world, name, world.store, what="init_process_group()")
    except BaseException:
        _stop(portal)
        raise
    _runtime.portal, _runtime.world, _runtime.backend = portal, world, name
    install_sigusr1()  # SIGUSR1 dumps the flight recorder (from the main thread; the loop's may be another)
    if _runtime.exit_hook_pid != os.getpid():
        _runtime.exit_hook_pid = os.getpid()
        call_at_exit(_close_at_exit, priority=20)  # before the loop threads stop (10)
        call_on_termination(_say_goodbye)
    _runtime.generation += 1


def destroy_process_group(group: Group = None) -> None:
    """Close every connection of this process and stop every thread
    ``init_process_group`` started (the loop's, the store's).

    Frames already sent are flushed first; peers still waiting on this rank
    get :class:`~asyncdist.errors.PeerLostError`. ``init_process_group`` may
    be called again afterwards.
    """
    world = _world()
    target = _group(group)
    if target is None:  # NON_GROUP_MEMBER: no group of this rank's
        return
    if target is not world:  # a subgroup: forget it (its sockets are the world's)
        _portal().run(target.close(), what="destroy_process_group()")
        return
    portal = _portal()
    try:
        portal.run(world.close(), what="destroy_process_group()")
    finally:
        _stop(portal)
        _runtime.portal = _runtime.world = _runtime.backend = None


def _stop(portal: LoopThread) -> None:
    """Stop every thread ``init_process_group`` started: the loop thread, and
    the store calls' threads unless another user of them has a call running
    (the TCP store's server thread stopped with the store, in ``world.close``)."""
    portal.stop()
    STORE_EXECUTOR.release_idle()


def is_available() -> bool:
    """True: asyncdist needs nothing beyond its Python dependencies."""
    return True


def is_initialized() -> bool:
    """True between ``init_process_group`` and ``destroy_process_group``."""
    return _runtime.world is not None


def _world() -> ProcessGroup:
    world = _runtime.world
    if world is None:
        raise _not_initialized()
    return world


def _not_initialized() -> NotInitializedError:
    return NotInitializedError(
        "Default process group has not been initialized, please make sure to call init_process_group."
    )


def _portal() -> LoopThread:
    portal = _runtime.portal
    if portal is None:  # set and cleared with the world
        raise _not_initialized()
    return portal


def _group(group: Group) -> ProcessGroup | None:
    """The group a facade call works on: the world for None; None for
    ``NON_GROUP_MEMBER``, which names no group.

    Raises:
        NotInitializedError: before ``init_process_group``.
        InvalidArgumentError: ``group`` is neither a group nor NON_GROUP_MEMBER.
    """
    world = _world()
    if group is None:
        return world
    if isinstance(group, ProcessGroup):
        return group
    if type(group) is int and group == NON_GROUP_MEMBER:
        return None
    raise InvalidArgumentError(f"group must be a process group, GroupMember.NON_GROUP_MEMBER or None, got {group!r}")


def _member(group: Group) -> ProcessGroup | None:
    """:func:`_group`'s group if this rank is in it, else None: torch's calls
    on a group a rank is not in return at once and touch nothing."""
    g = _group(group)
    return g if g is not None and g.rank >= 0 else None


def _member_and_portal(group: Group) -> tuple[ProcessGroup | None, LoopThread]:
    """:func:`_member`'s group and the loop its calls run on, in one lookup:
    every blocking call asks for both."""
    portal, world = _runtime.portal, _runtime.world
    if portal is None or world is None:  # set and cleared together
        raise _not_initialized()
    return (world if group is None else _member(group)), portal


def get_backend(group: Group = None) -> str:
    """The backend name given to ``init_process_group`` ("asyncdist" for None)."""
    _group(group)
    assert _runtime.backend is not None  # set with the world
    return _runtime.backend


def get_rank(group: Group = None) -> int:
    """This process's rank in ``group`` (default: the world); -1 if not a member."""
    g = _member(group)
    return -1 if g is None else g.rank


def get_world_size(group: Group = None) -> int:
    """The number of ranks in ``group`` (default: the world); -1 if not a member."""
    g = _member(group)
    return -1 if g is None else g.size


def get_backend_config(group: Group = None) -> str:
    """The backend's device map, as torch prints it: "cpu:gloo,cuda:gloo" for "gloo".

    Raises:
        ValueError: this rank is not in ``group``.
    """
    if _member(group) is None:
        raise InvalidArgumentError("Invalid process group specified")
    assert _runtime.backend is not None  # set with the world
    name = _runtime.backend
    if ":" in name:
        return name
    devices = ["cuda"] if name == "nccl" else ["cpu", "cuda"]
    return ",".join(f"{device}:{name}" for device in devices)


def get_pg_count() -> int:
    """How many groups this process has: the world and the open groups it is
    in (0 before ``init_process_group``). torch counts every group created."""
    world = _runtime.world
    if world is None:
        return 0
    count, pending = 1, [world]
    while pending:
        children = pending.pop().subgroups.groups
        count += len(children)
        pending.extend(children)
    return count


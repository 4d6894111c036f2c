"""Device operands in a group's operations (await API): the mixin that routes them.

Every collective and point-to-point method of
:class:`~asyncdist.group.process_group.ProcessGroup` accepts device arrays (torch
CUDA tensors, CuPy arrays) wherever it accepts host ones. This mixin sits in
front of :class:`~asyncdist.group.collectives.CollectiveMethods` and sends a
call that has a device operand down one of two paths, and every other call
straight through:

* the group's NCCL backend (:mod:`asyncdist.gpu.nccl`) if it has one;
* else pinned staging (:mod:`asyncdist.gpu.pinned_staging`): the host method runs
  unchanged on pinned host stand-ins.

The check costs a few hundred nanoseconds per host call and imports nothing.

Ordering, the one subtle part. A host operation takes its place in its
group's order at its first step (a collective its call number, a send its
place in the stream to its peer). A staged one must first copy its data off
the device, which takes an unknown time, so it takes its place at its first
step anyway: a collective reserves its call numbers
(:meth:`DeviceMethods.reserve_calls`), a send queues a *turn* that later
sends to the same peer wait behind. Both keep program order on every rank.

Loop thread only, like the group.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
from typing import Any, Callable, Iterator

from ..engine.channel import Channel
from ..errors import AsyncDistError, OperationCancelledError
from .collectives import CollectiveMethods
from ..gpu.device import adapter_for, any_device
from ..gpu.operands import SPECS
from ..gpu.pinned_staging import StagedP2P, run_staged
from .work import Work

__all__ = ["DeviceMethods", "CallReservation"]

# (group, call numbers) the running task's next channels take; see CallReservation.
_RESERVED: contextvars.ContextVar[tuple[Any, list[int]] | None] = contextvars.ContextVar(
    "asyncdist_reserved_calls", default=None
)
# Set in the task of a send whose turn has come: its own send must not queue again.
_MY_TURN: contextvars.ContextVar[bool] = contextvars.ContextVar("asyncdist_send_turn", default=False)


class CallReservation:
    """Collective call numbers taken now, for calls whose channels open later.

    Inside :meth:`active`, the group's ``channel()`` hands out these numbers,
    in order, instead of new ones. :meth:`abandon` fails the numbers never
    used, so the other members' matching calls fail at once (they get an
    ABORT) instead of waiting for their timeout.
    """

    __slots__ = ("_group", "_seqs")

    def __init__(self, group: Any, seqs: list[int]) -> None:
        self._group, self._seqs = group, seqs

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        token = _RESERVED.set((self._group, self._seqs))
        try:
            yield
        finally:
            _RESERVED.reset(token)

    def abandon(self, error: BaseException) -> None:
        g = self._group
        if not isinstance(error, AsyncDistError):
            error = OperationCancelledError(f"rank {g._engine.rank}: a device operation of group {g.name!r} was cancelled")
        seqs, self._seqs[:] = list(self._seqs), []
        for seq in seqs:
            channel = Channel(
                g._engine, g.ranks, g.rank, ctx=g._coll_ctx, seq=seq, op="device operation",
                timeout=g.timeout, group_name=g.name,
            )
            channel.fail(error)
            g._open_calls.discard(seq)


def _device_aware(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` (a collective of CollectiveMethods), accepting device operands."""
    name = method.__name__
    spec = SPECS[name]
    params = inspect.signature(method)

    # A coroutine function itself (not a def returning one), so that
    # inspect.iscoroutinefunction(ProcessGroup.all_reduce) stays true.
    @functools.wraps(method)
    async def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not any_device(args) and not (kwargs and any_device(kwargs.values())):
            return await method(self, *args, **kwargs)
        return await self._device_collective(method, name, spec, params, args, kwargs)

    return call


class DeviceMethods:
    """Mixin: device operands for the collectives and p2p of ProcessGroup.

    Attributes:
        nccl: the group's :class:`~asyncdist.gpu.nccl.NcclBackend`, or None
            (device operands are staged through pinned host memory).
        store: the store the members share (where NCCL unique ids travel),
            or None.
    """

    nccl: Any = None
    store: Any = None

    broadcast = _device_aware(CollectiveMethods.broadcast)
    all_reduce = _device_aware(CollectiveMethods.all_reduce)
    all_reduce_coalesced = _device_aware(CollectiveMethods.all_reduce_coalesced)
    reduce = _device_aware(CollectiveMethods.reduce)
    all_gather = _device_aware(CollectiveMethods.all_gather)
    all_gather_into_tensor = _device_aware(CollectiveMethods.all_gather_into_tensor)
    gather = _device_aware(CollectiveMethods.gather)
    scatter = _device_aware(CollectiveMethods.scatter)
    reduce_scatter = _device_aware(CollectiveMethods.reduce_scatter)
    reduce_scatter_tensor = _device_aware(CollectiveMethods.reduce_scatter_tensor)
    all_to_all = _device_aware(CollectiveMethods.all_to_all)
    all_to_all_single = _device_aware(CollectiveMethods.all_to_all_single)

    # -- collectives -----------------------------------------------------------

    async def _device_collective(self, method: Any, name: str, spec: Any, params: Any, args: tuple, kwargs: dict) -> Any:
        try:
            bound = params.bind(self, *args, **kwargs)
        except TypeError:
            return await method(self, *args, **kwargs)  # raises Python's own TypeError
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        del arguments[next(iter(params.parameters))]  # self
        if self.nccl is not None:
            return await self.nccl.collective(name, arguments)
        return await run_staged(self, name, spec, arguments, lambda host_args: method(self, **host_args))

    def reserve_calls(self, count: int) -> CallReservation:
        """Number this rank's next ``count`` collective calls of the group now.

        Loop thread. The calls' channels open later, inside the reservation's
        ``active()`` block; calls made meanwhile get later numbers.
        """
        self._check_member()  # type: ignore[attr-defined]
        first = self._seq + 1  # type: ignore[attr-defined]
        self._seq += count  # type: ignore[attr-defined]
        seqs = list(range(first, first + count))
        self._open_calls.update(seqs)  # type: ignore[attr-defined]
        return CallReservation(self, seqs)

    def _next_call(self) -> int:
        """The number of the collective call whose channel opens now (see reserve_calls)."""
        reserved = _RESERVED.get()
        if reserved is not None and reserved[0] is self and reserved[1]:
            return reserved[1].pop(0)
        self._seq += 1  # type: ignore[attr-defined]
        self._open_calls.add(self._seq)  # type: ignore[attr-defined]
        return self._seq  # type: ignore[attr-defined]

    # -- point to point ----------------------------------------------------------

    def _send_in_order(self, dst: int, send: Callable[[], asyncio.Future | None]) -> asyncio.Future | None:
        """Run ``send`` now, or after the device sends to ``dst`` still copying (so
        that no send overtakes an earlier one); returns its future."""
        gates = self.__dict__.get("_send_gates")
        previous = gates.get(dst) if gates else None
        if previous is None or _MY_TURN.get():
            return send()
        gate = self._queue_send(dst)

        async def later() -> None:
            await asyncio.wait([previous])
            _MY_TURN.set(True)
            try:
                sent = send()
            finally:
                self._end_turn(dst, gate)
            if sent is not None:
                await sent

        return _plain_future(asyncio.ensure_future(later()))

    def _queue_send(self, dst: int) -> asyncio.Future:
        gates: dict[int, asyncio.Future] = self.__dict__.setdefault("_send_gates", {})
        gate = asyncio.get_running_loop().create_future()
        gates[dst] = gate
        return gate

    def _end_turn(self, dst: int, gate: asyncio.Future) -> None:
        if not gate.done():
            gate.set_result(None)
        gates = self.__dict__.get("_send_gates", {})
        if gates.get(dst) is gate:
            del gates[dst]

    def _device_isend(self, tensor: Any, dst: int, tag: int) -> Work:
        """isend of a device tensor: copy off the device, then send in turn."""
        self._peer(dst, "dst")  # type: ignore[attr-defined]  # argument errors now, not in the task
        self._check_tag(tag)  # type: ignore[attr-defined]
        what = f"send to rank {dst} (tag {tag}, group {self.name!r}, device)"  # type: ignore[attr-defined]
        if self.nccl is not None:
            return Work(asyncio.ensure_future(self.nccl.p2p("send", tensor, dst)), what, [tensor])
        staged = StagedP2P(tensor, adapter_for(tensor), send=True, what=what)
        previous = self.__dict__.get("_send_gates", {}).get(dst)
        gate = self._queue_send(dst)
        deadline = asyncio.get_running_loop().time() + self.timeout  # type: ignore[attr-defined]

        async def run() -> None:
            try:
                try:
                    if previous is not None:
                        await asyncio.wait([previous])
                    await staged.ready(deadline)
                    _MY_TURN.set(True)
                    inner = self.isend(staged.host, dst, tag)  # type: ignore[attr-defined]
                finally:
                    self._end_turn(dst, gate)
                await inner
            finally:
                staged.release()

        return Work(asyncio.ensure_future(run()), what, [tensor])

    def _device_irecv(self, tensor: Any, src: int | None, tag: int) -> Work:
        """irecv into a device tensor: receive into a stand-in now, copy back after."""
        if self.nccl is not None:
            if src is None:
                self._check_member()  # type: ignore[attr-defined]
            what = f"recv from rank {src} (tag {tag}, group {self.name!r}, device)"  # type: ignore[attr-defined]
            return Work(asyncio.ensure_future(self.nccl.p2p("recv", tensor, src)), what, [tensor])
        what = f"recv (tag {tag}, group {self.name!r}, device)"  # type: ignore[attr-defined]
        staged = StagedP2P(tensor, adapter_for(tensor), send=False, what=what)
        try:
            inner = self.irecv(staged.host, src, tag)  # type: ignore[attr-defined]  # posted now: keeps its place
        except BaseException:
            staged.release()
            raise

        async def run() -> int:
            try:
                sender = await inner
                staged.write_back()
                return sender
            finally:
                staged.release()

        return Work(asyncio.ensure_future(run()), what, [tensor])


def _plain_future(task: asyncio.Task) -> asyncio.Future:
    """A future that a timeout may fail (a Task refuses set_exception), following ``task``."""
    future = task.get_loop().create_future()

    def transfer(done: asyncio.Task) -> None:
        if future.done():
            return
        if done.cancelled():
            future.cancel()
        elif done.exception() is not None:
            future.set_exception(done.exception())
        else:
            future.set_result(None)

    task.add_done_callback(transfer)
    future.add_done_callback(lambda f: task.cancel() if f.cancelled() or f.exception() else None)
    return future

"""Device operands in a group's operations (await API): where they are routed.

Every collective and point-to-point method of
:class:`~asyncdist.group.process_group.ProcessGroup` accepts device arrays (torch
CUDA tensors, CuPy arrays) wherever it accepts host ones. :class:`Devices`
sends a call that has a device operand down one of two paths:

* the group's NCCL backend (:mod:`asyncdist.gpu.nccl`) if it has one;
* else pinned staging (:mod:`asyncdist.gpu.pinned_staging`): the host method runs
  unchanged on pinned host stand-ins.

ProcessGroup asks :func:`~asyncdist.gpu.device.any_device` first, which
costs a few hundred nanoseconds per host call and imports nothing.

Ordering, the one subtle part. A host operation takes its place in its
group's order at its first step (a collective its call number, a send its
place in the stream to its peer). A staged one must first copy its data off
the device, which takes an unknown time, so it takes its place at its first
step anyway: a collective reserves its call numbers
(:meth:`~asyncdist.group.calls.Calls.reserve`), a send queues a *turn* that
later sends to the same peer wait behind
(:meth:`~asyncdist.group.p2p.PointToPoint.queue_send`). Both keep program
order on every rank.

Loop thread only, like the group.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Protocol

from ..gpu.device import DeviceAdapter, adapter_for
from ..gpu.operands import SPECS
from ..gpu.pinned_staging import StagedP2P, run_staged
from ..gpu.seams import StagingGroup
from .calls import Calls
from .collectives import Collectives
from .p2p import PointToPoint, check_tag
from .work import Work

if TYPE_CHECKING:  # imported where a group is given NCCL (asyncdist.gpu.use_nccl)
    from ..gpu.nccl import NcclBackend

__all__ = ["Devices", "DeviceGroup"]


class DeviceGroup(StagingGroup, Protocol):
    """The ProcessGroup, as its device collectives see it (it cannot be imported here)."""

    @property
    def collectives(self) -> Collectives: ...


@functools.cache
def _parameters(method: Callable[..., Any]) -> tuple[inspect.Signature, tuple[str, ...], dict[str, Any]]:
    """A collective's signature, its parameter names after ``self`` and their defaults
    (once per collective: ``inspect.signature`` and ``bind`` cost ~15 us a call)."""
    signature = inspect.signature(method)
    params = list(signature.parameters.values())[1:]
    simple = all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params)
    names = tuple(p.name for p in params) if simple else ()  # () : always bind
    return signature, names, {p.name: p.default for p in params if p.default is not p.empty}


def _arguments(method: Callable[..., Any], args: tuple, kwargs: dict) -> dict[str, Any]:
    """The call's arguments by name, defaults applied (``self`` left out).

    Raises:
        TypeError: they do not fit the method (Python's own message, from ``bind``).
    """
    signature, names, defaults = _parameters(method)
    fits = bool(names) and len(args) <= len(names)
    if fits and kwargs:  # every keyword known, and none given by position too
        fits = kwargs.keys() <= set(names[len(args):])
    if fits:
        arguments = {**defaults, **dict(zip(names, args)), **kwargs}
        if len(arguments) == len(names):  # none missing
            return arguments
    bound = signature.bind(None, *args, **kwargs)  # raises the TypeError
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    del arguments[next(iter(signature.parameters))]  # self
    return arguments


class Devices:
    """The device paths of one group's operations.

    Args:
        calls: the group's numbering and timeouts.
        p2p: the group's host point-to-point operations (staged sends and
            receives go through them, in turn).

    Attributes:
        nccl: the group's :class:`~asyncdist.gpu.nccl.NcclBackend`, or None
            (device operands are staged through pinned host memory).
    """

    def __init__(self, calls: Calls, p2p: PointToPoint) -> None:
        self._calls = calls
        self._members = calls.members
        self._p2p = p2p
        self.nccl: NcclBackend | None = None

    async def collective(self, group: DeviceGroup, method: Callable[..., Awaitable[Any]], args: tuple, kwargs: dict) -> Any:
        """Run collective ``method`` (a host method of ``group``) with device operands.

        Args:
            group: the ProcessGroup, whose reservation the staged path takes.
            method: the host collective, unbound (``Collectives.all_reduce``);
                its name says which collective this is.
            args, kwargs: the call's arguments, device arrays among them.
        """
        name = method.__name__
        try:
            arguments = _arguments(method, args, kwargs)
        except TypeError:
            return await method(group.collectives, *args, **kwargs)  # raises Python's own TypeError
        if self.nccl is not None:
            return await self.nccl.collective(name, arguments)
        return await run_staged(
            group, name, SPECS[name], arguments, lambda host_args: method(group.collectives, **host_args)
        )

    def isend(self, tensor: Any, dst: int, tag: int) -> Work:
        """isend of a device tensor: copy off the device, then send in turn."""
        self._members.peer(dst, "dst")  # argument errors now, not in the task
        check_tag(tag)
        what = f"send to rank {dst} (tag {tag}, group {self._members.name!r}, device)"
        if self.nccl is not None:
            return Work(asyncio.ensure_future(self.nccl.p2p("send", tensor, dst)), what, [tensor])
        staged = StagedP2P(tensor, _adapter(tensor), send=True, what=what)
        p2p = self._p2p
        previous, gate = p2p.queue_send(dst)
        operation = self._calls.device_operation("send", what)

        async def run() -> None:
            try:
                try:
                    if previous is not None:
                        await asyncio.wait([previous])
                    await staged.ready(operation)
                    p2p.my_turn()
                    inner = p2p.isend(staged.host, dst, tag)
                finally:
                    p2p.end_turn(dst, gate)
                await inner
            finally:
                staged.release()

        return Work(asyncio.ensure_future(run()), what, [tensor])

    def irecv(self, tensor: Any, src: int | None, tag: int) -> Work:
        """irecv into a device tensor: receive into a stand-in now, copy back after."""
        if self.nccl is not None:
            if src is None:
                self._members.check_member()
            what = f"recv from rank {src} (tag {tag}, group {self._members.name!r}, device)"
            return Work(asyncio.ensure_future(self.nccl.p2p("recv", tensor, src)), what, [tensor])
        what = f"recv (tag {tag}, group {self._members.name!r}, device)"
        staged = StagedP2P(tensor, _adapter(tensor), send=False, what=what)
        try:
            inner = self._p2p.irecv(staged.host, src, tag)  # posted now: keeps its place
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


def _adapter(tensor: Any) -> DeviceAdapter:
    """The adapter of ``tensor``, which ProcessGroup found to be a device array."""
    adapter = adapter_for(tensor)
    assert adapter is not None, f"{type(tensor).__name__} is routed as a device array but no adapter claims it"
    return adapter

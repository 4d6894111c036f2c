"""How ProcessGroup's methods reach its parts: the host or the device form of a call.

A collective asks whether an operand lives on a device and hands the call
to :class:`~.devices.Devices` if one does; otherwise it is the host
collective's own coroutine, not a coroutine around it (one await less per
call). Object collectives forward to :class:`~.objects.ObjectCollectives`.
"""

from __future__ import annotations

import functools
from typing import Any, Awaitable, Callable, Concatenate, Coroutine, ParamSpec, Protocol, TypeVar

from ..gpu.device import any_device
from .collectives import Collectives
from .devices import DeviceGroup, Devices
from .objects import ObjectCollectives
from .work import Work

__all__ = ["host_or_device", "objects_of", "completion"]

P = ParamSpec("P")
R = TypeVar("R")


class _Parts(DeviceGroup, Protocol):
    """What a forwarded method reads of its ProcessGroup (no import of it: no cycle)."""

    @property
    def objects(self) -> ObjectCollectives: ...

    @property
    def devices(self) -> Devices: ...


def host_or_device(
    method: Callable[Concatenate[Collectives, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[Any, P], Coroutine[Any, Any, R]]:
    """ProcessGroup's form of a host collective: device operands go to :class:`~.devices.Devices`.

    It returns the coroutine of the call that runs (the host one, or the
    device one), not a coroutine of its own around it: one await less per call.
    """

    @functools.wraps(method)
    def call(self: _Parts, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R]:
        if not any_device(args) and not (kwargs and any_device(kwargs.values())):
            return method(self.collectives, *args, **kwargs)
        return self.devices.collective(self, method, args, kwargs)

    return call


def objects_of(
    method: Callable[Concatenate[ObjectCollectives, P], Awaitable[R]],
) -> Callable[Concatenate[Any, P], Coroutine[Any, Any, R]]:
    """ProcessGroup's form of an object collective."""

    @functools.wraps(method)
    async def call(self: _Parts, *args: P.args, **kwargs: P.kwargs) -> R:
        return await method(self.objects, *args, **kwargs)

    return call


async def completion(start: Callable[[], Work]) -> Any:
    """The value of the Work that ``start`` starts, once it completes (started when awaited)."""
    return await start()

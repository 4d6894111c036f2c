"""The fake GPU as asyncdist sees it: a DeviceAdapter over :mod:`.fake_cuda`.

:class:`FakeAdapter` is the :class:`~asyncdist.gpu.device.DeviceAdapter` of
fake devices; :func:`install` registers it with asyncdist, and its NCCL is
:mod:`.fake_nccl`. The device itself (memory, streams, events) is
:mod:`.fake_cuda`'s, and its names are re-exported here, so that a test
imports one module.
"""

from __future__ import annotations

import contextlib
from typing import Any, Hashable

import numpy as np

from . import fake_nccl
from .fake_cuda import FakeArray, FakeDevice, FakeEvent, FakeStream, live_devices, resolve

__all__ = ["FakeDevice", "FakeArray", "FakeStream", "FakeEvent", "FakeAdapter", "install", "uninstall", "resolve"]


class FakeAdapter:
    """The DeviceAdapter of fake devices. ``pinned_allocations`` counts pinnings."""

    name = "fake"
    thread_waits = False  # its streams run when queried, on the loop thread: no worker may touch them

    def __init__(self) -> None:
        self.pinned_allocations = 0
        self.kept_alive: list[tuple[FakeArray, FakeStream]] = []

    @staticmethod
    def claims(obj: Any) -> bool:
        return isinstance(obj, FakeArray)

    def device_of(self, array: FakeArray) -> Hashable:
        return array.device

    def dtype_name(self, array: FakeArray) -> str:
        return array.dtype.name

    def shape(self, array: FakeArray) -> tuple[int, ...]:
        return array.shape

    def nbytes(self, array: FakeArray) -> int:
        return array.nbytes

    def problem(self, array: FakeArray) -> str | None:
        return None if array.contiguous else "is not contiguous: Tensors must be contiguous"

    # The DeviceAdapter protocol passes back what device_of returned, typed
    # as any Hashable; _fake narrows it.
    def current_stream(self, device: Hashable) -> FakeStream:
        return _fake(device).current_stream()

    def new_stream(self, device: Hashable) -> FakeStream:
        return _fake(device).new_stream("asyncdist")

    def record_event(self, stream: FakeStream) -> FakeEvent:
        return stream.device.record(stream)

    def stream_wait(self, stream: FakeStream, event: FakeEvent) -> None:
        stream.device.wait(stream, event)

    def query(self, event: FakeEvent) -> bool:
        return event.done or event.stream is None or event.stream.device.query(event)

    def synchronize(self, event: FakeEvent) -> None:
        if not self.query(event):  # querying runs the queued work: only a stream that waits stays behind
            raise RuntimeError("fake device: the event waits for work that is never queued")

    def capture(self) -> dict:
        return {(self, device): device.current_stream() for device in live_devices()}

    def alloc_pinned(self, nbytes: int) -> np.ndarray:
        self.pinned_allocations += 1
        return np.empty(nbytes, np.uint8)

    def host_view(self, pinned: np.ndarray, array: FakeArray) -> np.ndarray:
        return pinned[: array.nbytes].view(array.dtype).reshape(array.shape)

    def copy_to_host(self, pinned: np.ndarray, array: FakeArray, start: int, stop: int, stream: FakeStream) -> None:
        def copy() -> None:
            pinned[start:stop] = resolve(array.ptr, array.nbytes)[start:stop]

        stream.device.launch(copy, stream)

    def copy_to_device(self, array: FakeArray, pinned: np.ndarray, start: int, stop: int, stream: FakeStream) -> None:
        def copy() -> None:
            resolve(array.ptr, array.nbytes)[start:stop] = pinned[start:stop]

        stream.device.launch(copy, stream)

    def keep_alive(self, array: FakeArray, stream: FakeStream) -> None:
        self.kept_alive.append((array, stream))
        del self.kept_alive[:-64]

    def data_ptr(self, array: FakeArray) -> int:
        return array.ptr

    def stream_handle(self, stream: FakeStream) -> int:
        return stream.ptr

    def nccl(self) -> Any:
        return fake_nccl

    def on_device(self, device: Hashable) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def scale_(self, array: FakeArray, factor: float, stream: FakeStream) -> None:
        def kernel() -> None:
            mem = array.memory()
            mem[...] = (mem * factor).astype(array.dtype)

        stream.device.launch(kernel, stream)

    def scaled_copy(self, array: FakeArray, factor: float, stream: FakeStream) -> FakeArray:
        out = array.device.empty(array.shape, array.dtype)

        def kernel() -> None:
            out.memory()[...] = (array.memory() * factor).astype(array.dtype)

        stream.device.launch(kernel, stream)
        return out


def _fake(device: Hashable) -> FakeDevice:
    assert isinstance(device, FakeDevice), f"not a fake device: {device!r}"
    return device


_INSTALLED: list[FakeAdapter] = []


def install() -> FakeAdapter:
    """Register a :class:`FakeAdapter` with asyncdist (until :func:`uninstall`)."""
    from ..gpu.device import register_adapter

    adapter = FakeAdapter()
    register_adapter(FakeAdapter.claims, adapter, live=lambda: bool(live_devices()))
    _INSTALLED.append(adapter)
    return adapter


def uninstall(adapter: FakeAdapter) -> None:
    """Remove an adapter added by :func:`install`."""
    from ..gpu import pinned_staging as staging
    from ..gpu import pinned_pool
    from ..gpu.device import unregister_adapter

    unregister_adapter(adapter)
    pinned_pool._POOLS.pop(adapter, None)
    for key in [k for k in staging._SIDE_STREAMS if k[0] is adapter]:
        del staging._SIDE_STREAMS[key]
    if adapter in _INSTALLED:
        _INSTALLED.remove(adapter)

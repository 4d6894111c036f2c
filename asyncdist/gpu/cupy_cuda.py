"""The device adapter of CuPy arrays, and the one place asyncdist imports CuPy.

CuPy is optional, like torch: :func:`cupy_or_none` imports it on first use
(never at ``import asyncdist``), and :func:`nccl_module` is
``cupy.cuda.nccl``, which the NCCL path drives for CuPy arrays and torch
CUDA tensors alike. Copies are ``cudaMemcpyAsync`` between the array's
device pointer and pinned host memory from ``cupyx.empty_pinned``; streams
and events are ``cupy.cuda.Stream`` / ``cupy.cuda.Event``. CuPy's memory pool
has no ``record_stream``: a staged array is held by its pinned block until
the copies are complete (:mod:`.pinned_pool`), an NCCL operand by the op
until its completion event.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any, ContextManager, Hashable

from ..errors import InvalidArgumentError

__all__ = ["CupyAdapter", "cupy_or_none", "nccl_module"]

_H2D, _D2H = 1, 2  # cudaMemcpyKind


@functools.cache
def cupy_or_none() -> ModuleType | None:
    """Import CuPy on first use and cache the outcome (None when it is not installed)."""
    try:
        import cupy
    except ImportError:
        return None
    return cupy


def nccl_module() -> Any:
    """``cupy.cuda.nccl``, the module every NCCL call goes through.

    Raises:
        InvalidArgumentError: CuPy, or its NCCL binding, is not installed.
    """
    cupy = cupy_or_none()
    try:
        if cupy is None:
            raise ImportError("No module named 'cupy'")
        from cupy.cuda import nccl
    except ImportError as exc:
        raise InvalidArgumentError(
            f"backend 'nccl' needs CuPy with NCCL (pip install 'asyncdist[cuda]'): {exc}; "
            "or use pinned staging (backend 'gloo')"
        ) from exc
    if not getattr(nccl, "available", True):
        raise InvalidArgumentError("CuPy was built without NCCL; use pinned staging (backend 'gloo')")
    return nccl


class CupyAdapter:
    """:class:`~asyncdist.gpu.device.DeviceAdapter` for ``cupy.ndarray``."""

    name = "cupy"
    thread_waits = True

    def __init__(self) -> None:
        cupy = cupy_or_none()
        assert cupy is not None  # a CuPy array exists, so CuPy is imported
        self._cupy = cupy

    # -- describing arrays ---------------------------------------------------
    def device_of(self, a: Any) -> Hashable:
        return a.device.id

    def dtype_name(self, a: Any) -> str:
        return a.dtype.name

    def shape(self, a: Any) -> tuple[int, ...]:
        return tuple(a.shape)

    def nbytes(self, a: Any) -> int:
        return a.nbytes

    def problem(self, a: Any) -> str | None:
        if not a.flags.c_contiguous:
            return f"is not contiguous (strides {a.strides}): Tensors must be contiguous; pass cupy.ascontiguousarray()"
        if not a.dtype.isnative:
            return "is not in native byte order"
        return None

    # -- streams and events ----------------------------------------------------
    def current_stream(self, device: Hashable) -> Any:
        with self._cupy.cuda.Device(device):
            return self._cupy.cuda.get_current_stream()

    def new_stream(self, device: Hashable) -> Any:
        with self._cupy.cuda.Device(device):
            return self._cupy.cuda.Stream(non_blocking=True)

    def record_event(self, stream: Any) -> Any:
        # The null stream (CuPy's default current stream) belongs to no device
        # (device_id -1): it is the current device's.
        device = stream.device_id if stream.device_id >= 0 else self._cupy.cuda.runtime.getDevice()
        with self._cupy.cuda.Device(device):
            event = self._cupy.cuda.Event(disable_timing=True)
            event.record(stream)
        return event

    def stream_wait(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def query(self, event: Any) -> bool:
        return event.done

    def synchronize(self, event: Any) -> None:
        event.synchronize()  # releases the GIL

    def capture(self) -> dict:
        cuda = self._cupy.cuda
        device = cuda.runtime.getDevice()
        return {(self, device): cuda.get_current_stream()}

    # -- host staging ------------------------------------------------------------
    def alloc_pinned(self, nbytes: int) -> Any:
        import numpy as np
        import cupyx

        return cupyx.empty_pinned((nbytes,), dtype=np.uint8)

    def host_view(self, pinned: Any, a: Any) -> Any:
        return pinned[: a.nbytes].view(a.dtype).reshape(a.shape)

    def copy_to_host(self, pinned: Any, a: Any, start: int, stop: int, stream: Any) -> None:
        if stop > start:
            runtime = self._cupy.cuda.runtime
            runtime.memcpyAsync(pinned.ctypes.data + start, a.data.ptr + start, stop - start, _D2H, stream.ptr)

    def copy_to_device(self, a: Any, pinned: Any, start: int, stop: int, stream: Any) -> None:
        if stop > start:
            runtime = self._cupy.cuda.runtime
            runtime.memcpyAsync(a.data.ptr + start, pinned.ctypes.data + start, stop - start, _H2D, stream.ptr)

    def keep_alive(self, a: Any, stream: Any) -> None:
        return None  # held by asyncdist until its events complete (see the module doc)

    # -- NCCL ----------------------------------------------------------------------
    def data_ptr(self, a: Any) -> int:
        return a.data.ptr

    def stream_handle(self, stream: Any) -> int:
        return stream.ptr

    def nccl(self) -> Any:
        return nccl_module()

    def on_device(self, device: Hashable) -> ContextManager[Any]:
        return self._cupy.cuda.Device(device)

    def scale_(self, a: Any, factor: float, stream: Any) -> None:
        with stream:
            a *= a.dtype.type(factor) if a.dtype.kind == "f" else factor

    def scaled_copy(self, a: Any, factor: float, stream: Any) -> Any:
        with stream:
            return (a * factor).astype(a.dtype, copy=False)

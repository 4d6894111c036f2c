"""The device adapter of torch CUDA tensors.

Streams and events are torch's (``torch.cuda.Stream``, ``torch.cuda.Event``);
copies are ``Tensor.copy_(..., non_blocking=True)`` issued under
``torch.cuda.stream(side)``, between a flat uint8 view of the tensor and a
pinned uint8 host tensor, so every dtype (bfloat16, float8, complex) moves
as bytes. ``keep_alive`` is ``Tensor.record_stream``, which stops torch's
caching allocator from handing the tensor's memory to someone else while a
side stream still uses it (what ProcessGroupGloo does for CUDA tensors).
NCCL is CuPy's: :meth:`TorchCudaAdapter.nccl` needs CuPy, and hands NCCL the
tensors' ``data_ptr()`` and the streams' ``cuda_stream`` handles.

torch is reached through :mod:`asyncdist._torch`; this module is imported
only once a CUDA tensor has been seen, so torch is loaded already.
"""

from __future__ import annotations

import threading
from typing import Any, ContextManager, Hashable

from .._torch import torch_or_none
from ..buffers.host import torch_layout_problem

__all__ = ["TorchCudaAdapter"]


class TorchCudaAdapter:
    """:class:`~asyncdist.gpu.device.DeviceAdapter` for ``torch.Tensor`` on CUDA."""

    name = "torch"
    thread_waits = True

    def __init__(self) -> None:
        torch = torch_or_none()
        assert torch is not None  # a CUDA tensor exists, so torch is imported
        self._torch = torch
        self._lock = threading.Lock()

    # -- describing arrays ---------------------------------------------------
    def device_of(self, t: Any) -> Hashable:
        return t.device.index

    def dtype_name(self, t: Any) -> str:
        return str(t.dtype).removeprefix("torch.")

    def shape(self, t: Any) -> tuple[int, ...]:
        return tuple(t.shape)

    def nbytes(self, t: Any) -> int:
        return t.numel() * t.element_size()

    def problem(self, t: Any) -> str | None:
        problem = torch_layout_problem(t, self._torch)
        if problem is None and not t.is_contiguous():
            problem = f"is not contiguous (stride {t.stride()}): Tensors must be contiguous; pass .contiguous()"
        return problem

    # -- streams and events ----------------------------------------------------
    def current_stream(self, device: Hashable) -> Any:
        return self._torch.cuda.current_stream(device)

    def new_stream(self, device: Hashable) -> Any:
        return self._torch.cuda.Stream(device=device)

    def record_event(self, stream: Any) -> Any:
        event = self._torch.cuda.Event()
        event.record(stream)
        return event

    def stream_wait(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def query(self, event: Any) -> bool:
        return event.query()

    def synchronize(self, event: Any) -> None:
        event.synchronize()  # releases the GIL

    def capture(self) -> dict:
        cuda = self._torch.cuda
        if not cuda.is_initialized():
            return {}
        device = cuda.current_device()
        return {(self, device): cuda.current_stream(device)}

    # -- host staging ------------------------------------------------------------
    def alloc_pinned(self, nbytes: int) -> Any:
        return self._torch.empty(nbytes, dtype=self._torch.uint8, pin_memory=True)

    def host_view(self, pinned: Any, t: Any) -> Any:
        return pinned[: self.nbytes(t)].view(t.dtype).view(t.shape)

    def _bytes(self, t: Any) -> Any:
        return t.detach().reshape(-1).view(self._torch.uint8)

    def copy_to_host(self, pinned: Any, t: Any, start: int, stop: int, stream: Any) -> None:
        if stop > start:
            with self._torch.cuda.stream(stream):
                pinned[start:stop].copy_(self._bytes(t)[start:stop], non_blocking=True)

    def copy_to_device(self, t: Any, pinned: Any, start: int, stop: int, stream: Any) -> None:
        if stop > start:
            with self._torch.cuda.stream(stream):
                self._bytes(t)[start:stop].copy_(pinned[start:stop], non_blocking=True)

    def keep_alive(self, t: Any, stream: Any) -> None:
        if t.numel():
            t.record_stream(stream)

    # -- NCCL ----------------------------------------------------------------------
    def data_ptr(self, t: Any) -> int:
        return t.data_ptr()

    def stream_handle(self, stream: Any) -> int:
        return stream.cuda_stream

    def nccl(self) -> Any:
        from .cupy_cuda import nccl_module

        return nccl_module()

    def on_device(self, device: Hashable) -> ContextManager[Any]:
        return self._torch.cuda.device(device)

    def scale_(self, t: Any, factor: float, stream: Any) -> None:
        with self._torch.cuda.stream(stream):
            t.mul_(factor)

    def scaled_copy(self, t: Any, factor: float, stream: Any) -> Any:
        with self._torch.cuda.stream(stream):
            return t * factor

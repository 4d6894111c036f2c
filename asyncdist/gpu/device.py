"""Device adapters: the one seam between asyncdist and a GPU array library.

Everything asyncdist does with device memory (find a tensor's stream, record
and wait for events, copy bytes between device memory and pinned host
memory, hand raw pointers to NCCL) goes through a :class:`DeviceAdapter`.
There is one adapter per array library: torch CUDA tensors
(:mod:`asyncdist.gpu.torch_cuda`), CuPy arrays (:mod:`asyncdist.gpu.cupy_cuda`),
and, in tests, a fake device whose memory is NumPy arrays
(:mod:`asyncdist.testing.fake_device`). The staging pipeline and the NCCL
path are written against the protocol only, so the fake exercises the same
code a GPU runs.

This module owns the registry: which adapter, if any, *claims* an object.
A claim is a cheap predicate that imports nothing (torch's is
``is_torch_tensor(x) and x.is_cuda``; CuPy's looks in ``sys.modules``), so a
CPU program pays a few hundred nanoseconds per operand and never imports
CUDA. The adapter itself is built on the first claim.

Invariants:

* Importing this module imports neither torch, CuPy nor CUDA.
* Streams and events are the library's own objects; asyncdist only passes
  them back to the adapter that made them.
* Every copy an adapter issues is asynchronous with respect to the host: it
  is ordered on the stream it is given, and the host learns of its
  completion only through :meth:`DeviceAdapter.query`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Hashable, Iterable, Protocol, runtime_checkable

import numpy as np

from .._torch import is_torch_tensor
from ..reduce.op import RedOpType, ReduceOp

__all__ = ["DeviceAdapter", "register_adapter", "unregister_adapter", "adapter_for", "any_device", "live_adapters",
           "HOST_TYPES"]


@runtime_checkable
class DeviceAdapter(Protocol):
    """What asyncdist needs from a GPU array library (one object per library).

    Thread affinity: every method may be called from any thread; asyncdist
    calls them from its event loop's thread, except :meth:`capture`, which
    runs on the thread of a blocking facade call, and :meth:`synchronize`,
    which runs on a worker thread.
    """

    name: str
    #: Whether :meth:`synchronize` may block a worker thread (it releases the
    #: GIL while it waits); else events are only polled (the fake device).
    thread_waits: bool

    # -- describing arrays ---------------------------------------------------
    def device_of(self, array: Any) -> Hashable:
        """The device an array lives on (an index, or any hashable key)."""
    def dtype_name(self, array: Any) -> str:
        """The canonical dtype name (a key of :data:`asyncdist.buffers.host.ITEMSIZES`)."""
    def shape(self, array: Any) -> tuple[int, ...]: ...
    def nbytes(self, array: Any) -> int: ...
    def problem(self, array: Any) -> str | None:
        """Why ``array`` cannot be staged as it is (non-contiguous, ...), or None."""

    # -- streams and events ----------------------------------------------------
    def current_stream(self, device: Hashable) -> Any:
        """The calling thread's current stream on ``device``."""
    def new_stream(self, device: Hashable) -> Any:
        """A new stream on ``device`` (asyncdist keeps the few it makes)."""
    def record_event(self, stream: Any) -> Any:
        """An event recorded now on ``stream``: complete once the work queued before it is."""
    def stream_wait(self, stream: Any, event: Any) -> None:
        """Make work queued on ``stream`` from now on wait for ``event`` (no host wait)."""
    def query(self, event: Any) -> bool:
        """Whether ``event`` is complete; never blocks."""
    def synchronize(self, event: Any) -> None:
        """Block the calling thread until ``event`` is complete."""
    def capture(self) -> dict[tuple[DeviceAdapter, Hashable], Any]:
        """The calling thread's current streams, ``{(self, device): stream}``."""

    # -- host staging ------------------------------------------------------------
    def alloc_pinned(self, nbytes: int) -> Any:
        """``nbytes`` of page-locked host memory, as a 1-D uint8 host array."""
    def host_view(self, pinned: Any, array: Any) -> Any:
        """A host object over ``pinned``'s first bytes with ``array``'s dtype and shape,
        of a kind :func:`asyncdist.buffers.host.as_host_buffer` accepts."""
    def copy_to_host(self, pinned: Any, array: Any, start: int, stop: int, stream: Any) -> None:
        """Queue a copy of ``array``'s bytes ``[start, stop)`` into the same bytes of ``pinned``."""
    def copy_to_device(self, array: Any, pinned: Any, start: int, stop: int, stream: Any) -> None:
        """Queue a copy of ``pinned``'s bytes ``[start, stop)`` into the same bytes of ``array``."""
    def keep_alive(self, array: Any, stream: Any) -> None:
        """Tell the library's allocator that ``stream`` uses ``array`` (torch's record_stream)."""

    # -- NCCL ----------------------------------------------------------------------
    def data_ptr(self, array: Any) -> int: ...
    def stream_handle(self, stream: Any) -> int: ...
    def nccl(self) -> Any:
        """The ``cupy.cuda.nccl``-shaped module that drives this library's memory."""
    def on_device(self, device: Hashable) -> ContextManager[Any]:
        """Make ``device`` the calling thread's current device for a block."""
    def scale_(self, array: Any, factor: float, stream: Any) -> None:
        """Queue ``array *= factor`` on ``stream``."""
    def scaled_copy(self, array: Any, factor: float, stream: Any) -> Any:
        """Queue ``array * factor`` into a new array on ``stream``; return the new array."""


@dataclass(slots=True)
class _Entry:
    claims: Callable[[Any], bool]
    factory: Callable[[], DeviceAdapter]
    live: Callable[[], bool]
    adapter: DeviceAdapter | None = None
    registered: bool = False  # added with register_adapter

    def get(self) -> DeviceAdapter:
        if self.adapter is None:
            self.adapter = self.factory()
        return self.adapter


def _claims_torch(obj: Any) -> bool:
    return is_torch_tensor(obj) and obj.is_cuda


def _torch_live() -> bool:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    return cuda is not None and cuda.is_initialized()


def _torch_factory() -> DeviceAdapter:
    from .torch_cuda import TorchCudaAdapter

    return TorchCudaAdapter()


def _claims_cupy(obj: Any) -> bool:
    cupy = sys.modules.get("cupy")
    ndarray = getattr(cupy, "ndarray", None)
    return ndarray is not None and isinstance(obj, ndarray)


def _cupy_live() -> bool:
    return "cupy" in sys.modules


def _cupy_factory() -> DeviceAdapter:
    from .cupy_cuda import CupyAdapter

    return CupyAdapter()


_ENTRIES: list[_Entry] = [
    _Entry(_claims_torch, _torch_factory, _torch_live),
    _Entry(_claims_cupy, _cupy_factory, _cupy_live),
]


def register_adapter(
    claims: Callable[[Any], bool], adapter: DeviceAdapter, live: Callable[[], bool] | None = None
) -> None:
    """Add an adapter, consulted before the built-in ones (tests register a fake).

    Args:
        claims: a cheap predicate: is this object one of ``adapter``'s arrays?
        adapter: the adapter.
        live: whether the adapter may have arrays in use now (decides whether
            a blocking call captures its current streams); default: always.
    """
    _ENTRIES.insert(0, _Entry(claims, lambda: adapter, live or (lambda: True), adapter, registered=True))


def unregister_adapter(adapter: DeviceAdapter) -> None:
    """Remove an adapter added with :func:`register_adapter`."""
    _ENTRIES[:] = [e for e in _ENTRIES if not (e.registered and e.adapter is adapter)]


def adapter_for(obj: Any) -> DeviceAdapter | None:
    """The adapter that claims ``obj``, or None for host objects (any thread)."""
    for entry in _ENTRIES:
        if entry.claims(obj):
            return entry.get()
    return None


def any_device(values: Iterable[Any]) -> bool:
    """Whether any of ``values``, or any element of a list or tuple among them,
    is a device array. The host fast path: no adapter is built, and NumPy
    arrays and Python buffers are passed over without asking any adapter
    (about 0.1 us each; a torch CPU tensor costs about 0.5 us)."""
    for value in values:
        kind = type(value)
        if kind in HOST_TYPES:
            continue
        if kind is list or kind is tuple:
            if any_device(value):
                return True
            continue
        for entry in _ENTRIES:
            if entry.claims(value):
                return True
    return False


#: Types that are never device arrays (checked by exact type: subclasses ask the
#: adapters), among them the arguments that travel with arrays: ranks, tags, ops.
HOST_TYPES = frozenset(
    {np.ndarray, bytes, bytearray, memoryview, int, float, str, type(None), RedOpType, ReduceOp}
)


def live_adapters() -> list[DeviceAdapter]:
    """The adapters whose library is in use in this process (built on demand).

    Many blocking calls ask (:func:`~asyncdist.gpu.callers.caller_context`),
    so this is a plain loop: no comprehension's frame."""
    live = []
    for entry in _ENTRIES:
        if entry.live():
            live.append(entry.get())
    return live

"""A fake CUDA device for tests: device memory in NumPy arrays, streams as deferred queues.

:class:`FakeDevice` behaves like a CUDA device as far as asyncdist can tell:
work is *queued* on streams (kernels, copies, event records, waits on other
streams' events) and runs only when something needs it. It runs lazily and
minimally: :meth:`FakeDevice.query` executes at most ``steps_per_query`` ops
on the path to the event asked about (pulling in the ops of other streams a
wait depends on, and nothing else), and :meth:`FakeDevice.run_stream` runs
one stream up to its end. That makes ordering mistakes visible in results:

* a copy that does not wait for the caller's stream reads memory before the
  caller's queued kernel wrote it;
* a result that the caller's stream does not wait for is not there when a
  kernel queued on that stream later reads it (:meth:`FakeDevice.probe`).

:mod:`.fake_device` makes it a :class:`~asyncdist.gpu.device.DeviceAdapter`
and :mod:`.fake_nccl` stands in for ``cupy.cuda.nccl`` over it. Device
pointers are integers in one address space for all fake devices, so the
fake NCCL can move bytes between ranks' arrays as NCCL moves them between
GPUs. Current streams are per thread, as torch's.

Not thread-safe beyond that: drive a fake device from one thread at a time.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import threading
import weakref
from collections import deque
from typing import Any, Callable, Iterator

import numpy as np

__all__ = ["FakeDevice", "FakeArray", "FakeStream", "FakeEvent", "Hold", "live_devices", "resolve", "step"]

# One address space for every fake device: base pointer -> bytes.
_BASES: list[int] = []
_MEMORY: dict[int, np.ndarray] = {}
_NEXT_PTR = itertools.count(1 << 32, 1 << 32)  # 4 GiB apart: no allocation spans two
_STREAMS: weakref.WeakValueDictionary[int, FakeStream] = weakref.WeakValueDictionary()
_STREAM_IDS = itertools.count(0x1000)
_DEVICES: weakref.WeakSet[FakeDevice] = weakref.WeakSet()


def live_devices() -> list[FakeDevice]:
    """The fake devices that are still referenced."""
    return list(_DEVICES)


def resolve(ptr: int, nbytes: int) -> np.ndarray:
    """The ``nbytes`` bytes of fake device memory at ``ptr`` (a writable uint8 view)."""
    i = bisect.bisect_right(_BASES, ptr) - 1
    if i < 0:
        raise ValueError(f"fake device: bad pointer {ptr:#x}")
    base = _BASES[i]
    memory = _MEMORY[base]
    offset = ptr - base
    if offset + nbytes > memory.nbytes:
        raise ValueError(f"fake device: {nbytes} bytes at {ptr:#x} run past the allocation")
    return memory[offset : offset + nbytes]


def _free(ptr: int) -> None:
    _MEMORY.pop(ptr, None)
    i = bisect.bisect_left(_BASES, ptr)
    if i < len(_BASES) and _BASES[i] == ptr:
        del _BASES[i]


class FakeEvent:
    """An event: complete once its stream has run past the point it was recorded at."""

    __slots__ = ("stream", "done")

    def __init__(self) -> None:
        self.stream: FakeStream | None = None
        self.done = True  # never recorded: complete, as in CUDA


class FakeStream:
    """A queue of ops on one fake device; ``ptr`` is its handle (for the fake NCCL)."""

    def __init__(self, device: FakeDevice, name: str) -> None:
        self.device, self.name = device, name
        self.ops: deque[tuple[str, Any]] = deque()
        self.ptr = next(_STREAM_IDS)
        _STREAMS[self.ptr] = self

    def __repr__(self) -> str:
        return f"<FakeStream {self.name} of device {self.device.index}: {len(self.ops)} queued>"

    @staticmethod
    def from_handle(ptr: int) -> FakeStream:
        return _STREAMS[ptr]


class FakeArray:
    """An array in fake device memory. Read it only through the device (``probe``, ``read``)."""

    __slots__ = ("device", "ptr", "dtype", "shape", "contiguous", "__weakref__")

    def __init__(self, device: FakeDevice, ptr: int, dtype: Any, shape: tuple[int, ...], contiguous: bool = True) -> None:
        self.device, self.ptr, self.dtype, self.shape = device, ptr, np.dtype(dtype), tuple(shape)
        self.contiguous = contiguous

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def memory(self) -> np.ndarray:
        """The device memory as a typed array (for kernels: it does not wait for queued work)."""
        return resolve(self.ptr, self.nbytes).view(self.dtype).reshape(self.shape)

    def __repr__(self) -> str:
        return f"<FakeArray {self.dtype}{list(self.shape)} on fake device {self.device.index}>"


class FakeDevice:
    """One fake GPU: memory, a default stream, side streams, a per-thread current stream."""

    def __init__(self, index: int = 0, *, steps_per_query: int = 1) -> None:
        self.index = index
        self.steps_per_query = steps_per_query
        self.default_stream = FakeStream(self, "default")
        self._local = threading.local()
        _DEVICES.add(self)

    def __repr__(self) -> str:
        return f"<FakeDevice {self.index}>"

    # -- streams -------------------------------------------------------------
    def current_stream(self) -> FakeStream:
        """This thread's current stream (the default stream unless :meth:`stream` set one)."""
        return getattr(self._local, "stream", None) or self.default_stream

    @contextlib.contextmanager
    def stream(self, stream: FakeStream) -> Iterator[FakeStream]:
        """Make ``stream`` this thread's current stream for a block (torch.cuda.stream)."""
        previous = getattr(self._local, "stream", None)
        self._local.stream = stream
        try:
            yield stream
        finally:
            self._local.stream = previous

    def new_stream(self, name: str = "side") -> FakeStream:
        """A new stream of this device (``torch.cuda.Stream()``)."""
        return FakeStream(self, name)

    # -- memory ----------------------------------------------------------------
    def empty(self, shape: tuple[int, ...] | int, dtype: Any) -> FakeArray:
        """A new zeroed device array (its memory goes when the array does)."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        ptr = next(_NEXT_PTR)
        _MEMORY[ptr] = np.zeros(max(nbytes, 1), np.uint8)
        bisect.insort(_BASES, ptr)
        array = FakeArray(self, ptr, dtype, shape)
        weakref.finalize(array, _free, ptr)
        return array

    def array(self, values: Any, dtype: Any = None) -> FakeArray:
        """A device array holding ``values`` (copied now, as ``torch.tensor(..., device=...)``)."""
        host = np.ascontiguousarray(values, dtype=dtype)
        out = self.empty(host.shape, host.dtype)
        out.memory()[...] = host
        return out

    # -- work --------------------------------------------------------------------
    def launch(self, kernel: Callable[[], None], stream: FakeStream | None = None) -> None:
        """Queue ``kernel`` on ``stream`` (default: this thread's current stream)."""
        (stream or self.current_stream()).ops.append(("kernel", kernel))

    def fill(self, array: FakeArray, values: Any, stream: FakeStream | None = None) -> None:
        """Queue a kernel that writes ``values`` into ``array``."""
        snapshot = np.array(values, dtype=array.dtype)

        def kernel() -> None:
            array.memory()[...] = snapshot

        self.launch(kernel, stream)

    def hold(self, stream: FakeStream | None = None) -> Hold:
        """Queue an op that blocks ``stream`` until the returned hold is released
        (a kernel that runs for as long as a test wants)."""
        hold = Hold()
        (stream or self.current_stream()).ops.append(("rendezvous", hold))
        return hold

    def record(self, stream: FakeStream) -> FakeEvent:
        event = FakeEvent()
        event.stream, event.done = stream, False
        stream.ops.append(("record", event))
        return event

    def wait(self, stream: FakeStream, event: FakeEvent) -> None:
        if not event.done:
            stream.ops.append(("wait", event))

    def query(self, event: FakeEvent) -> bool:
        """Run at most ``steps_per_query`` ops toward ``event``; whether it is complete."""
        for _ in range(self.steps_per_query):
            if event.done or event.stream is None or not step(event.stream, frozenset()):
                break
        return event.done

    def run_stream(self, stream: FakeStream | None = None) -> None:
        """Run ``stream`` (default: the current one) to its end, and what it waits for."""
        stream = stream or self.current_stream()
        while stream.ops:
            if not step(stream, frozenset()):
                raise RuntimeError(f"fake device: {stream} is stuck (waits for work never queued)")

    def synchronize(self) -> None:
        """Run every stream of every fake device to its end."""
        progressed = True
        while progressed:
            progressed = any(step(s, frozenset()) for s in list(_STREAMS.values()) if s.ops)
        stuck = [s for s in _STREAMS.values() if s.ops]
        if stuck:
            raise RuntimeError(f"fake device: streams stuck: {stuck}")

    def probe(self, array: FakeArray) -> np.ndarray:
        """What a kernel queued now on the current stream reads from ``array``."""
        seen: list[np.ndarray] = []
        self.launch(lambda: seen.append(array.memory().copy()))
        self.run_stream()
        return seen[0]

    def read(self, array: FakeArray) -> np.ndarray:
        """``array``'s contents once all queued work has run."""
        self.synchronize()
        return array.memory().copy()


class Hold:
    """A queued op that does not finish until :meth:`release` (see :meth:`FakeDevice.hold`)."""

    def __init__(self) -> None:
        self.released = False

    def release(self) -> None:
        self.released = True

    def advance(self, visiting: frozenset) -> str:
        return "done" if self.released else "stuck"


def step(stream: FakeStream, visiting: frozenset) -> bool:
    """Run the op at the head of ``stream`` if it can run, first the ops it waits
    for; whether anything ran."""
    if not stream.ops or stream in visiting:
        return False
    kind, payload = stream.ops[0]
    if kind == "wait":
        if not payload.done:
            return step(payload.stream, visiting | {stream})
        stream.ops.popleft()
        return True
    if kind == "rendezvous":  # an op that needs other streams' heads (the fake NCCL)
        state = payload.advance(visiting | {stream})
        if state == "done":
            stream.ops.popleft()
        return state != "stuck"
    stream.ops.popleft()
    if kind == "kernel":
        payload()
    else:  # record
        payload.done = True
    return True

"""Fixtures of the GPU tests: one body of tests over every device array library.

Every test here runs once per *kind* of device array (mpi4py's arrayimpl
pattern): ``fake`` (:mod:`asyncdist.testing.fake_device`, NumPy memory and
lazy streams; always runs), ``torch`` (CUDA tensors) and ``cupy`` (CuPy
arrays). The last two are marked ``gpu`` and skip themselves unless CUDA
(and CuPy) is there, so ``pytest tests/gpu`` on a CPU machine runs the fake
kind, and on a GPU machine runs all three: the staging tests with 2 to 4
ranks sharing the one GPU, the NCCL tests with a one-rank communicator
(NCCL refuses two ranks of one communicator on one GPU).

``worlds`` keeps local worlds of every size on one background loop (as
``tests/collectives`` does); a test hands it a coroutine per rank, which
gets a :class:`Rank`: the rank's group and helpers that make, fill and read
device arrays of the kind on the rank's current stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
from typing import Any, Callable, Coroutine, Iterator

import numpy as np
import pytest

from asyncdist.gpu.device import adapter_for
from asyncdist.loop.thread import LoopThread
from asyncdist.group.process_group import ProcessGroup
from asyncdist.testing import fake_device, local_world
from asyncdist.testing.fake_device import FakeDevice


class Rank:
    """One rank's group and device, with helpers that queue work on its current stream."""

    kind = "fake"

    def __init__(self, group: ProcessGroup) -> None:
        self.g = group
        self.dev = FakeDevice(group.rank)

    def put(self, values: Any, dtype: Any = None) -> Any:
        """A device array whose values are written by work queued on the current stream
        (on the fake, not run yet: an op that does not wait for the stream reads zeros)."""
        host = np.asarray(values, dtype=dtype)
        array = self.dev.empty(host.shape, host.dtype)
        self.dev.fill(array, host)
        return array

    def empty(self, shape: Any, dtype: Any) -> Any:
        return self.dev.empty(shape, dtype)

    def get(self, array: Any) -> np.ndarray:
        """What work queued now on the current stream reads from ``array``."""
        return self.dev.probe(array)

    def busy(self) -> None:
        """Queue long-running work on the current stream."""
        for _ in range(50):
            self.dev.launch(lambda: None)

    def new_stream(self) -> Any:
        return self.dev.new_stream("test")

    def use(self, stream: Any) -> contextlib.AbstractContextManager:
        return self.dev.stream(stream)

    def non_contiguous(self, values: Any) -> Any:
        array = self.put(values)
        array.contiguous = False
        return array

    @property
    def adapter(self) -> Any:
        return adapter_for(self.empty(1, np.float32))


class TorchRank(Rank):
    kind = "torch"

    def __init__(self, group: ProcessGroup) -> None:
        import torch

        self.g, self.torch = group, torch
        self.device = torch.device("cuda", group.rank % torch.cuda.device_count())

    def put(self, values: Any, dtype: Any = None) -> Any:
        host = self.torch.from_numpy(np.array(values, dtype=dtype))
        return host.to(self.device)  # a copy queued on the current stream

    def empty(self, shape: Any, dtype: Any) -> Any:
        torch_dtype = self.torch.from_numpy(np.zeros(0, dtype)).dtype
        return self.torch.empty(shape, dtype=torch_dtype, device=self.device)

    def get(self, array: Any) -> np.ndarray:
        return array.cpu().numpy()  # ordered on the current stream, as any user read

    def busy(self) -> None:
        self.torch.cuda._sleep(50_000_000)  # a spin kernel of some tens of milliseconds

    def new_stream(self) -> Any:
        return self.torch.cuda.Stream(device=self.device)

    def use(self, stream: Any) -> contextlib.AbstractContextManager:
        return self.torch.cuda.stream(stream)

    def non_contiguous(self, values: Any) -> Any:
        return self.put(np.repeat(np.asarray(values), 2))[::2]


#: A kernel that spins for a number of GPU clock cycles (CuPy has no ``_sleep``).
_SPIN_KERNEL = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
}
"""


class CupyRank(Rank):
    kind = "cupy"

    def __init__(self, group: ProcessGroup) -> None:
        import cupy

        self.g, self.cupy = group, cupy
        self.device = group.rank % cupy.cuda.runtime.getDeviceCount()

    def put(self, values: Any, dtype: Any = None) -> Any:
        with self.cupy.cuda.Device(self.device):
            return self.cupy.asarray(np.array(values, dtype=dtype))

    def empty(self, shape: Any, dtype: Any) -> Any:
        with self.cupy.cuda.Device(self.device):
            return self.cupy.empty(shape, dtype)

    def get(self, array: Any) -> np.ndarray:
        return self.cupy.asnumpy(array)

    def busy(self) -> None:
        with self.cupy.cuda.Device(self.device):
            self.cupy.RawKernel(_SPIN_KERNEL, "spin")((1,), (1,), (np.int64(50_000_000),))  # as torch.cuda._sleep

    def new_stream(self) -> Any:
        with self.cupy.cuda.Device(self.device):
            return self.cupy.cuda.Stream(non_blocking=True)

    def use(self, stream: Any) -> contextlib.AbstractContextManager:
        return stream

    def non_contiguous(self, values: Any) -> Any:
        return self.put(np.repeat(np.asarray(values), 2))[::2]


RANKS = {"fake": Rank, "torch": TorchRank, "cupy": CupyRank}


def _skip_unless_available(kind: str) -> None:
    if kind == "fake":
        return
    if importlib.util.find_spec("torch" if kind == "torch" else "cupy") is None:
        pytest.skip(f"{kind} is not installed")
    if kind == "torch":
        import torch

        if not torch.cuda.is_available():
            pytest.skip("no CUDA device (torch.cuda.is_available() is False)")
    else:
        import cupy

        try:
            if cupy.cuda.runtime.getDeviceCount() < 1:
                pytest.skip("no CUDA device")
        except cupy.cuda.runtime.CUDARuntimeError:
            pytest.skip("no CUDA device")


class Worlds:
    """Local worlds by size on one loop thread; each rank a :class:`Rank` of one kind."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.portal = LoopThread("gpu-test-worlds")
        self._stack = contextlib.AsyncExitStack()
        self._worlds: dict[int, list[Rank]] = {}

    def get(self, n: int) -> list[Rank]:
        if n not in self._worlds:
            groups = self.portal.run(self._stack.enter_async_context(local_world(n, timeout=60)))
            self._worlds[n] = [RANKS[self.kind](g) for g in groups]
        return self._worlds[n]

    def run(self, n: int, per_rank: Callable[[Rank], Coroutine[Any, Any, Any]]) -> list[Any]:
        """Run ``per_rank`` on every rank of the size-n world at once; results by rank."""
        ranks = self.get(n)

        async def all_ranks() -> list[Any]:
            return await asyncio.gather(*(per_rank(r) for r in ranks))

        return self.portal.run(all_ranks())

    def close(self) -> None:
        self.portal.run(self._stack.aclose())
        self.portal.stop()


@pytest.fixture(scope="module", params=["fake", pytest.param("torch", marks=pytest.mark.gpu), pytest.param("cupy", marks=pytest.mark.gpu)])
def kind(request) -> str:
    _skip_unless_available(request.param)
    return request.param


@pytest.fixture(scope="module")
def worlds(kind) -> Iterator[Worlds]:
    adapter = fake_device.install() if kind == "fake" else None
    w = Worlds(kind)
    try:
        yield w
    finally:
        w.close()
        if adapter is not None:
            fake_device.uninstall(adapter)


@pytest.fixture
def fake_only(kind) -> None:
    """For tests that drive the fake device's internals (streams held, lazy runs)."""
    if kind != "fake":
        pytest.skip("drives the fake device's internals")


@pytest.fixture(scope="module")
def fake() -> Iterator[Any]:
    """The fake adapter alone (tests that do not need ranks of every kind)."""
    adapter = fake_device.install()
    yield adapter
    fake_device.uninstall(adapter)

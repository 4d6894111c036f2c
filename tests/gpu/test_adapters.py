"""The parts of the real adapters that need no GPU: views, checks, errors, the NCCL id."""

from __future__ import annotations

import asyncio
import importlib.util

import numpy as np
import pytest

from asyncdist.buffers.host import ITEMSIZES, as_host_buffer
from asyncdist.errors import DeviceError, InvalidArgumentError
from asyncdist.reduce.op import ReduceOp, make_premul_sum
from asyncdist.gpu.device import any_device, register_adapter, unregister_adapter
from asyncdist.gpu.nccl import _id_bytes, _id_tuple
from asyncdist.gpu.pinned_staging import device_errors

torch = pytest.importorskip("torch")

DTYPES = ["float32", "bfloat16", "float16", "complex64", "bool", "int8", "uint64", "float8_e4m3fn"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (3, 4)])
def test_torch_stand_in_has_the_tensors_dtype_shape_and_bytes(dtype, shape):
    """A CUDA tensor's stand-in is a view of the pinned bytes with its dtype and shape
    (the same code on a CPU tensor: only copies and streams need CUDA)."""
    from asyncdist.gpu.torch_cuda import TorchCudaAdapter

    adapter = TorchCudaAdapter()
    t = (torch.arange(int(np.prod(shape))) % 7).to(getattr(torch, dtype)).reshape(shape)
    assert adapter.dtype_name(t) == dtype and adapter.shape(t) == shape
    assert adapter.nbytes(t) == t.numel() * ITEMSIZES[dtype]
    pinned = torch.zeros(adapter.nbytes(t) + 64, dtype=torch.uint8)  # blocks are larger than asked
    pinned[: adapter.nbytes(t)] = adapter._bytes(t)
    host = adapter.host_view(pinned, t)
    assert host.dtype == t.dtype and tuple(host.shape) == shape
    assert torch.equal(host.reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8))
    buf = as_host_buffer(host, writable=True)  # the host path takes it
    assert (buf.dtype, buf.shape, buf.nbytes) == (dtype, shape, adapter.nbytes(t))


def test_torch_problems():
    from asyncdist.gpu.torch_cuda import TorchCudaAdapter

    adapter = TorchCudaAdapter()
    assert adapter.problem(torch.zeros(3)) is None
    assert "contiguous" in adapter.problem(torch.zeros(4, 4).t())
    assert "conjugate" in adapter.problem(torch.ones(3, dtype=torch.complex64).conj())
    assert "layout" in adapter.problem(torch.eye(3).to_sparse())


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed here")
def test_nccl_without_cupy_says_what_to_install():
    from asyncdist.gpu.cupy_cuda import nccl_module

    with pytest.raises(InvalidArgumentError, match="CuPy"):
        nccl_module()


def test_library_errors_become_device_errors():
    with pytest.raises(DeviceError, match="all_reduce: RuntimeError: CUDA error: an illegal memory access") as info:
        with device_errors("all_reduce"):
            raise RuntimeError("CUDA error: an illegal memory access")
    assert isinstance(info.value.__cause__, RuntimeError)
    with pytest.raises(InvalidArgumentError):  # asyncdist's own errors pass through
        with device_errors("all_reduce"):
            raise InvalidArgumentError("bad")
    with pytest.raises(asyncio.CancelledError):  # and so does a cancellation
        with device_errors("all_reduce"):
            raise asyncio.CancelledError()
    with device_errors("all_reduce"):  # and nothing happens without an error
        pass


def test_nccl_unique_id_survives_the_store():
    unique_id = tuple(range(-128, 0))  # 128 signed chars, as cupy.cuda.nccl.get_unique_id()
    raw = _id_bytes(unique_id)
    assert isinstance(raw, bytes) and len(raw) == 128
    assert _id_tuple(raw) == unique_id


def test_plain_arguments_are_not_offered_to_the_adapters():
    # Every operation asks whether its arguments are device arrays; arrays of
    # the host, ranks, tags and reduce ops are answered without the adapters.
    asked = []
    adapter = object()
    register_adapter(lambda obj: asked.append(obj) or False, adapter)  # type: ignore[arg-type]
    try:
        plain = (np.zeros(2), ReduceOp.SUM, make_premul_sum(0.5), "x", 3, 1.5, None, b"x", [np.ones(1), 2])
        assert not any_device(plain)
        assert asked == []
        other = object()
        assert not any_device((other,))
        assert asked == [other]
    finally:
        unregister_adapter(adapter)  # type: ignore[arg-type]

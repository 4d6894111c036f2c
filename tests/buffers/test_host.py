"""Tests for asyncdist.buffers.host and asyncdist._torch: zero-copy views of every
NumPy and torch dtype, and the errors for what cannot be sent."""

from __future__ import annotations

import array
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncdist._torch import is_torch_tensor, torch_or_none
from asyncdist.buffers.host import (
    ITEMSIZES,
    HostBuffer,
    as_host_buffer,
    check_fits,
    describe,
    numpy_view,
)
from asyncdist.errors import BufferMismatchError, UnsupportedBufferError

torch = torch_or_none()
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

pytestmark = [
    # Creating complex32 or quantized tensors warns; the code under test does not.
    pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental:UserWarning"),
    pytest.mark.filterwarnings("ignore:.*quantize_per_tensor.*:UserWarning"),
    pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta:UserWarning"),
]

NUMPY_DTYPES = [
    "bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
    "float16", "float32", "float64", "complex64", "complex128",
]  # fmt: skip
SHAPES = [(), (0,), (5,), (2, 3), (2, 0, 3)]
REPO = Path(__file__).resolve().parents[2]


def _probe_torch_dtypes() -> list:
    """Every distinct torch.dtype but the quantized ones, found by probing torch."""
    if torch is None:
        return []
    every = {v for v in vars(torch).values() if isinstance(v, torch.dtype)}
    quantized = ("torch.qint", "torch.quint")
    return sorted((d for d in every if not str(d).startswith(quantized)), key=str)


TORCH_DTYPES = _probe_torch_dtypes()


def _name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _random_bytes(n: int, seed: int, *, bool_: bool = False) -> np.ndarray:
    # Bools must hold 0 or 1 to be valid values in numpy and torch.
    return np.random.default_rng(seed).integers(0, 2 if bool_ else 256, n, dtype=np.uint8)


def _torch_tensor(dtype, shape):
    """A tensor of random bytes, and the uint8 tensor that owns its memory."""
    n = math.prod(shape) * dtype.itemsize
    if n == 0:
        return torch.empty(shape, dtype=dtype), torch.empty(0, dtype=torch.uint8)
    raw = torch.from_numpy(_random_bytes(n, seed=len(shape), bool_=dtype == torch.bool))
    return raw.view(dtype).reshape(shape), raw


def _numpy_array(dtype: str, shape) -> np.ndarray:
    n = math.prod(shape) * np.dtype(dtype).itemsize
    return _random_bytes(n, seed=len(shape), bool_=dtype == "bool").view(dtype).reshape(shape)


def _address(buf: HostBuffer) -> int:
    return np.frombuffer(buf.view, np.uint8).ctypes.data


# -- torch -------------------------------------------------------------------


@needs_torch
def test_itemsizes_match_every_torch_dtype():
    assert {_name(d) for d in TORCH_DTYPES} == set(ITEMSIZES)
    for d in TORCH_DTYPES:
        assert ITEMSIZES[_name(d)] == d.itemsize, d


@needs_torch
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=_name)
def test_torch_view_is_the_tensors_bytes(dtype, shape):
    t, raw = _torch_tensor(dtype, shape)
    buf = as_host_buffer(t)
    assert (buf.dtype, buf.shape) == (_name(dtype), shape)
    assert buf.view.format == "B" and buf.view.ndim == 1 and buf.view.readonly
    assert len(buf.view) == buf.nbytes == t.numel() * dtype.itemsize
    assert buf.numel == t.numel()
    assert bytes(buf.view) == raw.numpy().tobytes()
    if _name(dtype) in NUMPY_DTYPES:  # a second, independent route
        assert bytes(buf.view) == t.numpy().tobytes()
    if t.numel():
        assert _address(buf) == t.data_ptr()


@needs_torch
@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=_name)
def test_torch_writes_through_the_view(dtype):
    for shape in [(), (2, 3)]:
        t, raw = _torch_tensor(dtype, shape)
        before = raw[-1].item()
        buf = as_host_buffer(t, writable=True)
        assert not buf.view.readonly
        buf.view[-1] ^= 1  # stays a valid bool
        assert raw[-1].item() == before ^ 1


@needs_torch
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "complex64"])
def test_torch_requires_grad(dtype):
    t = torch.zeros(4, dtype=getattr(torch, dtype), requires_grad=True)
    buf = as_host_buffer(t, writable=True)
    buf.view[:] = b"\xff" * buf.nbytes
    assert bytes(t.detach().view(torch.uint8).numpy()) == b"\xff" * buf.nbytes
    assert as_host_buffer(torch.nn.Parameter(torch.ones(2, 3))).shape == (2, 3)


@needs_torch
def test_torch_empty_with_zero_stride():
    t = torch.from_numpy(np.zeros((0, 3), np.int16))  # torch gives it stride (0, 1)
    buf = as_host_buffer(t, writable=True)
    assert (buf.dtype, buf.shape, buf.nbytes, buf.view.readonly) == ("int16", (0, 3), 0, False)


@needs_torch
def test_torch_contiguous_slice_keeps_its_offset():
    t = torch.arange(10, dtype=torch.int64)
    buf = as_host_buffer(t[3:7])
    assert bytes(buf.view) == t.numpy()[3:7].tobytes()
    assert _address(buf) == t.data_ptr() + 3 * 8


def _non_contiguous_tensors():
    base = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    return {
        "transposed": base.transpose(1, 2),
        "strided": base[:, :, ::2],
        "channels_last": base.reshape(1, 2, 3, 4).to(memory_format=torch.channels_last),
        "expanded": torch.zeros(1, 4).expand(3, 4),
    }


@needs_torch
@pytest.mark.parametrize("case", ["transposed", "strided", "channels_last", "expanded"])
def test_torch_non_contiguous_refused(case):
    t = _non_contiguous_tensors()[case]
    with pytest.raises(UnsupportedBufferError) as info:
        as_host_buffer(t, name="grads")
    message = str(info.value)
    assert "Tensors must be contiguous" in message
    for part in ["grads", "torch.float32", str(tuple(t.shape)), str(t.stride())]:
        assert part in message
    # Caught by code written for torch's errors (RuntimeError from send/recv,
    # ValueError from all_to_all_single).
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, ValueError)


@needs_torch
def test_torch_gloo_uses_the_same_words(tmp_path):
    """Pins the wording we borrow: torch 2.13's gloo all_to_all_single raises
    ValueError("Tensors must be contiguous") for a non-contiguous input."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        t = torch.arange(16.0).reshape(4, 4).t()
        with pytest.raises(ValueError) as torch_error:
            dist.all_to_all_single(torch.empty(4, 4), t)
    finally:
        dist.destroy_process_group()
    with pytest.raises(UnsupportedBufferError) as ours:
        as_host_buffer(t)
    assert str(torch_error.value) in str(ours.value)


def _unsupported_tensors():
    return {
        "meta": (torch.zeros(3, device="meta"), "meta"),
        "sparse_coo": (torch.eye(3).to_sparse(), "torch.sparse_coo"),
        "sparse_csr": (torch.eye(3).to_sparse_csr(), "torch.sparse_csr"),
        "nested": (
            torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)], layout=torch.jagged),
            "nested",
        ),
        "quantized": (torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8), "quantized"),
        "conj": (torch.ones(3, dtype=torch.complex64).conj(), "conjugate"),
    }


@needs_torch
@pytest.mark.parametrize(
    "case", ["meta", "sparse_coo", "sparse_csr", "nested", "quantized", "conj"]
)
def test_torch_unsupported_device_or_layout(case):
    t, words = _unsupported_tensors()[case]
    with pytest.raises(UnsupportedBufferError, match="^x .*" + words):
        as_host_buffer(t, name="x")


@needs_torch
def test_is_torch_tensor():
    assert is_torch_tensor(torch.zeros(1)) and is_torch_tensor(torch.nn.Parameter(torch.zeros(1)))
    assert not is_torch_tensor(np.zeros(1)) and not is_torch_tensor(torch.float32)


def test_no_torch_import():
    """buffers works for NumPy without importing torch, and without torch at all."""
    code = (
        "import sys, numpy as np\n"
        "from asyncdist._torch import is_torch_tensor, torch_or_none\n"
        "from asyncdist.buffers.host import as_host_buffer\n"
        "assert as_host_buffer(np.zeros(3)).dtype == 'float64'\n"
        "assert not is_torch_tensor(np.zeros(3))\n"
        "assert 'torch' not in sys.modules\n"
        "sys.modules['torch'] = None  # makes `import torch` fail\n"
        "assert torch_or_none() is None and not is_torch_tensor(1)\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)


# -- numpy and the buffer protocol -------------------------------------------


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_numpy_view_is_the_arrays_bytes(dtype, shape):
    a = _numpy_array(dtype, shape)
    buf = as_host_buffer(a)
    assert (buf.dtype, buf.shape, buf.numel) == (dtype, shape, a.size)
    assert buf.view.format == "B" and buf.view.ndim == 1 and buf.view.readonly
    assert len(buf.view) == buf.nbytes == a.nbytes == a.size * ITEMSIZES[dtype]
    assert bytes(buf.view) == a.tobytes()
    if a.size:
        assert _address(buf) == a.ctypes.data


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_numpy_writes_through_and_numpy_view_round_trips(dtype):
    a = _numpy_array(dtype, (2, 3))
    buf = as_host_buffer(a, writable=True)
    typed = numpy_view(buf)
    assert typed.dtype == a.dtype and typed.shape == a.shape and typed.flags.writeable
    assert np.shares_memory(typed, a) and typed.tobytes() == a.tobytes()
    before = a.copy()
    buf.view[0] ^= 1
    assert a.view(np.uint8).reshape(-1)[0] == before.view(np.uint8).reshape(-1)[0] ^ 1
    typed[...] = before  # and back through the typed view
    assert a.tobytes() == before.tobytes()
    assert not numpy_view(as_host_buffer(a)).flags.writeable


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from(NUMPY_DTYPES),
    shape=st.lists(st.integers(0, 4), max_size=4).map(tuple),
)
def test_numpy_any_shape(dtype, shape):
    a = _numpy_array(dtype, shape)
    buf = as_host_buffer(a, writable=True)
    assert (buf.shape, buf.nbytes, buf.numel) == (shape, a.nbytes, a.size)
    typed = numpy_view(buf)
    assert (typed.dtype, typed.shape, typed.tobytes()) == (a.dtype, shape, a.tobytes())
    flat = numpy_view(buf, flat=True)
    assert (flat.dtype, flat.shape, flat.flags.writeable) == (a.dtype, (a.size,), True)
    assert flat.tobytes() == a.tobytes()  # bit for bit: NaNs and signed zeros too
    if a.size:
        assert np.shares_memory(flat, a)


def test_numpy_scalar_is_a_read_only_0d_buffer():
    buf = as_host_buffer(np.float32(1.5))
    assert (buf.dtype, buf.shape, bytes(buf.view)) == ("float32", (), np.float32(1.5).tobytes())
    with pytest.raises(UnsupportedBufferError, match="receive buffer is read-only"):
        as_host_buffer(np.float32(1.5), writable=True)


@pytest.mark.parametrize(
    "a",
    [np.zeros((3, 4)).T, np.zeros(8)[::2], np.broadcast_to(np.zeros(3), (2, 3))],
    ids=["transposed", "strided", "broadcast"],
)
def test_numpy_non_contiguous_refused(a):
    with pytest.raises(UnsupportedBufferError) as info:
        as_host_buffer(a, name="out")
    message = str(info.value)
    for part in ["Tensors must be contiguous", "out", "float64", str(a.shape), str(a.strides)]:
        assert part in message


def test_read_only_refused_for_receive_only():
    a = np.zeros(3)
    a.flags.writeable = False
    assert bytes(as_host_buffer(a).view) == a.tobytes()
    for obj in [a, b"abc", memoryview(bytearray(3)).toreadonly()]:
        with pytest.raises(UnsupportedBufferError, match="receive buffer is read-only"):
            as_host_buffer(obj, writable=True)


@pytest.mark.parametrize(
    "a",
    [
        np.zeros(2, np.longdouble),
        np.zeros(2, np.clongdouble),
        np.zeros(2, ">f4"),
        np.zeros(2, object),
        np.zeros(2, "datetime64[s]"),
        np.zeros(2, "U3"),
        np.zeros(2, [("a", "i4"), ("b", "f8")]),
    ],
    ids=lambda a: a.dtype.str,
)
def test_numpy_unsupported_dtypes(a):
    with pytest.raises(UnsupportedBufferError, match="has a dtype asyncdist cannot send"):
        as_host_buffer(a)


def test_buffer_protocol_objects_are_uint8():
    ba = bytearray(b"hello")
    buf = as_host_buffer(ba, writable=True)
    assert (buf.dtype, buf.shape, bytes(buf.view)) == ("uint8", (5,), b"hello")
    buf.view[0] = ord("j")
    assert ba == bytearray(b"jello")
    assert as_host_buffer(b"abc").shape == (3,)
    d = array.array("d", [1.0, 2.0])
    assert (as_host_buffer(d).shape, bytes(as_host_buffer(d).view)) == ((16,), d.tobytes())
    assert as_host_buffer(memoryview(np.zeros((0, 3)))).shape == (0,)
    with pytest.raises(UnsupportedBufferError, match="Tensors must be contiguous"):
        as_host_buffer(memoryview(bytearray(6))[::2])


@pytest.mark.parametrize("obj", [[1, 2], 3.0, None, "text"], ids=repr)
def test_other_objects_refused(obj):
    with pytest.raises(UnsupportedBufferError, match=f"x is a {type(obj).__name__}, .*NumPy"):
        as_host_buffer(obj, name="x")


# -- records, describe, check_fits -------------------------------------------


def test_host_buffer_record():
    buf = as_host_buffer(np.zeros(2))
    assert not hasattr(buf, "__dict__")
    with pytest.raises(AttributeError, match="immutable"):
        buf.dtype = "int8"
    assert (buf.nbytes, buf.numel) == (16, 2)
    assert buf != as_host_buffer(np.zeros(2)) and buf == buf


def test_describe():
    assert describe("float32", (4, 2)) == "float32[4, 2] (32 bytes)"
    assert describe("bool", ()) == "bool[] (1 bytes)"
    assert describe("bfloat16", (0, 3)) == "bfloat16[0, 3] (0 bytes)"
    assert describe("float99", (2,)) == "float99[2] (unknown dtype)"


def test_check_fits_accepts_same_count_in_any_shape():
    buf = as_host_buffer(np.zeros((2, 4), np.float32), writable=True)
    for shape in [(2, 4), (8,), (4, 1, 2)]:
        check_fits(sent_dtype="float32", sent_shape=shape, buf=buf, sender="a", receiver="b")
    scalar = as_host_buffer(np.zeros(1, np.int64), writable=True)
    check_fits(sent_dtype="int64", sent_shape=(), buf=scalar, sender="a", receiver="b")


def test_check_fits_refuses_naming_both_sides():
    buf = as_host_buffer(np.zeros(4, np.int64), writable=True)
    sides = {"sender": "rank 1", "receiver": "rank 0"}
    with pytest.raises(BufferMismatchError) as info:
        check_fits(sent_dtype="float32", sent_shape=(4,), buf=buf, **sides)
    assert str(info.value) == (
        "rank 1 sent float32[4] (16 bytes) but the receive buffer on rank 0 is int64[4] (32 bytes)"
    )
    with pytest.raises(BufferMismatchError, match=r"sent int64\[5\] .* is int64\[4\]"):
        check_fits(sent_dtype="int64", sent_shape=(5,), buf=buf, **sides)


@needs_torch
@pytest.mark.parametrize(
    "dtype", [d for d in TORCH_DTYPES if _name(d) not in NUMPY_DTYPES], ids=_name
)
def test_numpy_view_is_none_without_a_numpy_dtype(dtype):
    assert numpy_view(as_host_buffer(_torch_tensor(dtype, (3,))[0])) is None


@needs_torch
def test_numpy_view_of_a_tensor_shares_its_memory():
    t = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    typed = numpy_view(as_host_buffer(t, writable=True))
    typed += 1
    assert t.tolist() == [[1, 2, 3], [4, 5, 6]]

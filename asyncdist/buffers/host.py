"""Array adapters: a user's object as a flat byte view of its own memory.

The runtime moves raw bytes; this module owns the one step between a user's
object (a NumPy array or scalar, a torch CPU tensor, any object with the
buffer protocol) and those bytes. :func:`as_host_buffer` returns a
:class:`HostBuffer`: a 1-D ``"B"`` memoryview over the object's memory plus
the canonical dtype name and the shape that travel in the frame header.
:func:`check_fits` decides whether a message fits a receive buffer, and
:func:`numpy_view` gives reductions a typed array over the same memory.

It knows nothing of ranks, frames or sockets: ``sender``/``receiver`` are
plain words supplied by the caller for error messages.

Invariants:

* **Zero copy.** ``HostBuffer.view`` aliases the object's memory: writing
  through a writable view changes the object. Nothing here copies array data.
  The view holds a reference that keeps the memory alive.
* ``len(view) == nbytes == numel * ITEMSIZES[dtype]`` and ``dtype`` is a key
  of :data:`ITEMSIZES`; that table is the list of names that may travel.
* Canonical dtype names are torch's without ``"torch."`` ("float32",
  "bfloat16", "bool", ...); NumPy dtypes map to the same names. Sub-byte and
  packed torch dtypes (``float4_e2m1fn_x2``, ``uint4``, ``bits8``, ...) travel
  as torch stores them, one element per ``ITEMSIZES[dtype]`` bytes.
* Only C-contiguous memory is accepted: a flat view of anything else would
  not be the object's elements in order. torch 2.13's gloo refuses
  non-contiguous tensors in ``send``/``recv`` ("input tensor has to be
  contiguous") and ``all_to_all_single`` ("Tensors must be contiguous"), though
  its other collectives accept them; we raise :class:`UnsupportedBufferError`
  with torch's words, and a caller that wants torch's leniency copies first.
* torch is never imported here: it is reached through :mod:`asyncdist._torch`,
  and only once the caller has passed a tensor (so torch is loaded already).
"""

from __future__ import annotations

import functools
import math
from types import MappingProxyType
from collections.abc import Mapping
from typing import Any

import numpy as np

from .._torch import is_torch_tensor, torch_or_none
from ..errors import BufferMismatchError, UnsupportedBufferError

__all__ = [
    "ITEMSIZES",
    "NUMPY_DTYPES",
    "HostBuffer",
    "as_host_buffer",
    "describe",
    "check_fits",
    "numpy_view",
]

# The dtypes NumPy has natively, by their canonical (torch) names. np.dtype(name)
# of each is the matching NumPy dtype, and np.dtype(...).name gives the name back.
_NUMPY_ITEMSIZES = {
    "bool": 1,
    "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8,
    "int8": 1, "int16": 2, "int32": 4, "int64": 8,
    "float16": 2, "float32": 4, "float64": 8,
    "complex64": 8, "complex128": 16,
}  # fmt: skip

# Every dtype torch 2.13 has except the quantized ones (qint8, quint8, ...),
# which carry a scale and zero point besides their bytes. Kept as a literal
# table, not probed from torch, so that a rank without torch can still check
# and describe a message that carries a torch-only dtype; tests compare it
# with torch's own itemsizes so that a new torch dtype cannot slip by.
ITEMSIZES: Mapping[str, int] = MappingProxyType(
    {
        **_NUMPY_ITEMSIZES,
        "bfloat16": 2,
        "complex32": 4,
        "float8_e4m3fn": 1, "float8_e4m3fnuz": 1,
        "float8_e5m2": 1, "float8_e5m2fnuz": 1,
        "float8_e8m0fnu": 1,
        "float4_e2m1fn_x2": 1,  # two 4-bit floats packed in each element
        "bits8": 1, "bits16": 2, "bits1x8": 1, "bits2x4": 1, "bits4x2": 1,
        # Sub-byte integer "shell" dtypes: torch stores one element per byte.
        **{f"{sign}int{bits}": 1 for sign in ("", "u") for bits in range(1, 8)},
    }
)  # fmt: skip
"""Canonical dtype name -> bytes per element, for every name that may travel."""

# NumPy dtype -> canonical name, for the native byte order only (a swapped
# dtype compares unequal, so it is not found).
_NUMPY_NAMES = {np.dtype(name): name for name in _NUMPY_ITEMSIZES}
#: Canonical name -> NumPy dtype, for the dtypes NumPy has (:func:`numpy_view`'s).
NUMPY_DTYPES = {name: dtype for dtype, name in _NUMPY_NAMES.items()}


class HostBuffer:
    """A flat byte view of an array's memory, with its dtype and shape.

    Immutable, and compared by identity: comparing memoryviews compares
    their contents, O(nbytes), and a writable memoryview cannot be hashed,
    neither of which a per-message record should do by accident. Its size is
    computed once, as it is made: every message of a call reads it several times.

    Attributes:
        view: 1-D memoryview of format ``"B"`` and length ``nbytes`` over the
            object's own memory; read-only unless made with ``writable=True``.
        dtype: canonical dtype name, a key of :data:`ITEMSIZES`.
        shape: the object's shape; ``()`` for a 0-d tensor or a scalar.
        nbytes: size of the data in bytes.
        numel: number of elements (1 for a 0-d buffer).
    """

    __slots__ = ("view", "dtype", "shape", "nbytes", "numel")

    view: memoryview
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    numel: int

    def __init__(self, view: memoryview, dtype: str, shape: tuple[int, ...]) -> None:
        init = object.__setattr__
        init(self, "view", view)
        init(self, "dtype", dtype)
        init(self, "shape", shape)
        init(self, "nbytes", view.nbytes)
        init(self, "numel", math.prod(shape))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"HostBuffer is immutable: cannot set {name!r}")

    def __repr__(self) -> str:
        return f"HostBuffer({describe(self.dtype, self.shape)})"

    def elements(self, start: int, stop: int) -> HostBuffer:
        """Elements ``[start, stop)`` as a flat buffer over the same memory."""
        size = ITEMSIZES[self.dtype]
        return HostBuffer(self.view[start * size : stop * size], self.dtype, (stop - start,))


def scratch_buffer(dtype: str, numel: int) -> HostBuffer:
    """A new, uninitialised, writable flat buffer of ``numel`` elements."""
    return HostBuffer(np.empty(numel * ITEMSIZES[dtype], np.uint8).data, dtype, (numel,))


def as_host_buffer(obj: Any, *, writable: bool = False, name: str = "tensor") -> HostBuffer:
    """View ``obj``'s memory as a :class:`HostBuffer`, without copying.

    Accepted: C-contiguous NumPy arrays and scalars of bool, (u)int8-64,
    float16/32/64 and complex64/128 in native byte order; contiguous, dense torch CPU
    tensors of every dtype in :data:`ITEMSIZES` (``requires_grad`` is fine: the
    bytes are read or written directly, as torch.distributed does); any other
    C-contiguous object with the buffer protocol (bytearray, memoryview,
    array.array, and bytes when not ``writable``), as ``"uint8"`` of shape
    ``(nbytes,)``.

    Args:
        obj: the object to send from or receive into.
        writable: ask for a writable view, for a receive buffer. Without it
            the view is read-only.
        name: what to call ``obj`` in error messages (an argument's name).

    Returns:
        A :class:`HostBuffer` aliasing ``obj``'s memory. Any thread.

    Raises:
        UnsupportedBufferError: ``obj`` is of an unsupported type, dtype,
            device or layout; is not contiguous (the message contains torch's
            "Tensors must be contiguous"); or is read-only while ``writable``.

    Example:
        >>> buf = as_host_buffer(np.zeros((4, 2), np.float32), writable=True)
        >>> buf.dtype, buf.shape, buf.nbytes
        ('float32', (4, 2), 32)
    """
    if isinstance(obj, (np.ndarray, np.generic)):  # inline, not a call: every message converts its buffer
        dtype = _NUMPY_NAMES.get(obj.dtype)  # one lookup: numpy's dtype.name costs 5 us
        if dtype is None or not obj.flags.c_contiguous or (writable and not obj.flags.writeable):
            raise _numpy_refused(obj, dtype, name)
        memory: Any = obj  # a NumPy scalar has the buffer protocol too, unlike its stub
        try:
            view = memoryview(memory).cast("B")
        except TypeError:
            view = _bytes_of(obj)  # an empty N-d array
        return HostBuffer(view if writable else view.toreadonly(), dtype, obj.shape)
    if is_torch_tensor(obj):
        return _from_torch(obj, writable=writable, name=name)
    return _from_buffer_protocol(obj, writable=writable, name=name)


@functools.lru_cache(maxsize=1024)  # every collective call describes its buffer
def signature(dtype: str, shape: tuple[int, ...]) -> str:
    """The compact form of a dtype and shape, as collectives describe their calls.

    Example:
        >>> signature("float32", (4, 2))
        'float32[4, 2]'
    """
    return f"{dtype}[{', '.join(str(d) for d in shape)}]"


def describe(dtype: str, shape: tuple[int, ...]) -> str:
    """Describe a message or buffer for error messages.

    Example:
        >>> describe("float32", (4, 2))
        'float32[4, 2] (32 bytes)'
        >>> describe("bool", ())
        'bool[] (1 bytes)'
    """
    itemsize = ITEMSIZES.get(dtype)
    if itemsize is None:  # a name from a peer that this version does not know
        return f"{signature(dtype, shape)} (unknown dtype)"
    return f"{signature(dtype, shape)} ({math.prod(shape) * itemsize} bytes)"


def check_fits(
    *,
    sent_dtype: str,
    sent_shape: tuple[int, ...],
    buf: HostBuffer,
    sender: str,
    receiver: str,
) -> None:
    """Check that a message fits a receive buffer.

    The dtype must be equal and the element count must be equal; the shape
    may differ (torch semantics: a receive copies bytes, so a ``[4, 2]``
    message fills an ``[8]`` buffer).

    Args:
        sent_dtype: the dtype name the sender put in the frame header.
        sent_shape: the shape the sender put in the frame header.
        buf: the receive buffer.
        sender: the sender, for the message (e.g. ``"rank 1"``).
        receiver: the receiver, for the message (e.g. ``"rank 0"``).

    Raises:
        BufferMismatchError: naming both sides, e.g. "rank 1 sent float32[4]
            (16 bytes) but the receive buffer on rank 0 is int64[4] (32 bytes)".
    """
    if sent_dtype != buf.dtype or math.prod(sent_shape) != buf.numel:
        raise BufferMismatchError(
            f"{sender} sent {describe(sent_dtype, sent_shape)} but the receive "
            f"buffer on {receiver} is {describe(buf.dtype, buf.shape)}"
        )


def numpy_view(buf: HostBuffer, *, flat: bool = False) -> np.ndarray | None:
    """A NumPy array of ``buf``'s dtype and shape over the same memory.

    Args:
        flat: give the array 1-D (what element-wise kernels want) instead of
            ``buf``'s shape.

    Returns:
        The array (writable exactly when ``buf.view`` is), or ``None`` for
        dtypes NumPy lacks (bfloat16, complex32, the float8 family, ...).
    """
    dtype = NUMPY_DTYPES.get(buf.dtype)
    if dtype is None:
        return None
    array = np.frombuffer(buf.view, dtype=dtype)
    return array if flat else array.reshape(buf.shape)


# -- adapters ----------------------------------------------------------------


def _from_torch(t: Any, *, writable: bool, name: str) -> HostBuffer:
    # A small tensor's operation pays for every check here: each is in its
    # cheapest form, and the error message is built only on an error.
    torch = torch_or_none()
    assert torch is not None  # a tensor exists, so torch is imported
    dtype = str(t.dtype).removeprefix("torch.")
    problem = _torch_problem(t, torch)
    if problem is None and dtype not in ITEMSIZES:
        problem = "has a dtype asyncdist does not know"
    if problem is not None:
        raise UnsupportedBufferError(f"{name} ({_tensor_what(t)}) {problem}")
    if not t.is_contiguous():
        raise _not_contiguous(f"{name} is a {_tensor_what(t)} with stride {t.stride()}")
    if t.numel() == 0:
        # Nothing to alias, and torch gives some empty tensors a stride of 0
        # (torch.from_numpy of an empty array), which .view(torch.uint8) refuses.
        return _host_buffer(memoryview(bytearray()), dtype, tuple(t.shape), writable)
    try:
        if dtype in _NUMPY_ITEMSIZES:  # the quick view, where NumPy has the dtype
            flat = (t.detach() if t.requires_grad else t).numpy()
        else:  # every dtype, bfloat16 and float8 included; each step is a view
            flat = t.detach().reshape(-1).view(torch.uint8).numpy()
    except (RuntimeError, TypeError) as exc:  # exotic subclasses without storage
        raise UnsupportedBufferError(f"{name} ({_tensor_what(t)}) has no CPU memory to view: {exc}") from exc
    return _host_buffer(_bytes_of(flat), dtype, tuple(t.shape), writable)


def _tensor_what(t: Any) -> str:
    return f"{t.dtype} tensor of shape {tuple(t.shape)}"


def _torch_problem(t: Any, torch: Any) -> str | None:
    """Why tensor ``t`` cannot be viewed as host bytes, or ``None`` if it can.

    The one place that decides devices and layouts. CUDA tensors never get
    here through a group's operations: :mod:`asyncdist.gpu` stages them
    through pinned host memory first (or hands them to NCCL), and checks
    their layout with :func:`torch_layout_problem`.
    """
    if t.is_cpu:  # the quick test (t.device builds an object)
        return torch_layout_problem(t, torch)
    if t.device.type == "cuda":
        return (
            f"is on device {t.device}; a group's operations take CUDA tensors directly "
            "(asyncdist.gpu stages them), but this call needs host memory (move it with .cpu())"
        )
    return f"is on device {t.device}; only CPU and CUDA tensors are supported (move it with .cpu())"


def torch_layout_problem(t: Any, torch: Any) -> str | None:
    """Why tensor ``t``'s memory does not hold its elements as a dense array, or None.

    Device-independent: the host path and the CUDA staging share it.
    """
    if t.is_nested:
        return "is a nested tensor; send its components one by one"
    if t.layout != torch.strided:
        return f"has layout {t.layout}; only dense tensors are supported (use .to_dense())"
    if t.is_quantized:
        return "is quantized; send .int_repr() and its scale and zero point instead"
    if t.is_conj() or t.is_neg():
        # A lazy conjugate/negative view: its memory does not hold its values.
        return "has its conjugate or negative bit set; call .resolve_conj().resolve_neg() first"
    return None


def _numpy_refused(a: np.ndarray | np.generic, dtype: str | None, name: str) -> UnsupportedBufferError:
    """Why :func:`as_host_buffer` refuses ``a``: its dtype (None: not one asyncdist
    sends), its layout, or (only asked for a writable buffer) that it is read-only."""
    if dtype is None:
        return UnsupportedBufferError(
            f"{name} ({_numpy_what(a)}) has a dtype asyncdist cannot send; supported are "
            f"{', '.join(_NUMPY_ITEMSIZES)}, in native byte order"
        )
    if not a.flags.c_contiguous:
        return _not_contiguous(f"{name} is a {_numpy_what(a)} with byte strides {a.strides}")
    return _read_only(name, _numpy_what(a))


def _numpy_what(a: np.ndarray | np.generic) -> str:
    kind = "array" if isinstance(a, np.ndarray) else "scalar"
    return f"{a.dtype} NumPy {kind} of shape {a.shape}"


def _from_buffer_protocol(obj: Any, *, writable: bool, name: str) -> HostBuffer:
    try:
        mv = memoryview(obj)
    except TypeError:
        raise UnsupportedBufferError(
            f"{name} is a {type(obj).__qualname__}, which asyncdist "
            "cannot send or receive: pass a NumPy array, a torch CPU tensor, or an object "
            "with the buffer protocol (bytearray, memoryview; bytes for sending only)"
        ) from None
    what = f"{type(obj).__qualname__} of format {mv.format!r} and shape {mv.shape}"
    if not mv.c_contiguous:
        raise _not_contiguous(f"{name} is a {what} with byte strides {mv.strides}")
    if writable and mv.readonly:
        raise _read_only(name, what)
    view = _bytes_of(mv)
    return _host_buffer(view, "uint8", (view.nbytes,), writable)


# -- helpers -----------------------------------------------------------------


def _bytes_of(obj: Any) -> memoryview:
    """``obj``'s C-contiguous memory as a 1-D ``"B"`` memoryview (writable when ``obj`` is)."""
    try:
        return memoryview(obj).cast("B")
    except TypeError:
        # An empty N-d buffer, which cast refuses; np.frombuffer takes any
        # C-contiguous buffer whatever its format and shape.
        return np.frombuffer(obj, dtype=np.uint8).data


def _host_buffer(
    view: memoryview, dtype: str, shape: tuple[int, ...], writable: bool
) -> HostBuffer:
    return HostBuffer(view if writable else view.toreadonly(), dtype, shape)


def _not_contiguous(what: str) -> UnsupportedBufferError:
    return UnsupportedBufferError(
        f"Tensors must be contiguous: {what}. Pass a contiguous copy "
        "(.contiguous() / np.ascontiguousarray), and copy a receive buffer back after."
    )


def _read_only(name: str, what: str) -> UnsupportedBufferError:
    return UnsupportedBufferError(f"receive buffer is read-only: {name} ({what})")

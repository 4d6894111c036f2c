"""The element-wise kernels of a reduction, run in place on host buffers.

This module owns how an op is carried out: the three steps that the collective
algorithms run on :class:`~asyncdist.buffers.host.HostBuffer` s, on NumPy ufuncs
where NumPy has the dtype and on torch views of the same memory where it does
not. What an op is, and which dtype it is defined for, is
:mod:`asyncdist.reduce.op`'s; its names are re-exported here so that
``from asyncdist.reduce.kernels import ReduceOp, check_op`` keeps working. This module
knows nothing of ranks, messages or algorithms: a collective validates once,
then drives the three steps of a reduction::

    check_op(op, buf.dtype)          # every rank, before anything moves
    prepare(op, own)                 # PREMUL_SUM: own *= factor
    combine(op, acc, received)       # acc = op(acc, received), any number of times
    folder(op, acc)                  # the same, for a message folded in as it arrives
    finish(op, acc, world_size)      # AVG: acc /= world_size, once, on the result

Invariants:

* **In place, zero copy.** Results are written into the accumulator's own
  memory. NumPy dtypes run ufuncs with ``out=`` on views of that memory and
  allocate nothing in proportion to the data. Dtypes NumPy lacks go through
  torch views of the same memory; where torch has no kernel for the dtype
  (float8_*, and complex32, whose kernels are partial and experimental) the
  work is done in float32 / complex64 on chunks of :data:`_UPCAST_CHUNK`
  elements and rounded back into the same memory once per step, so
  temporaries stay bounded (about 0.5 MiB) whatever the size.
* **Deterministic.** ``combine`` is a pure element-wise function of its two
  inputs; the result depends only on the order in which the algorithm
  combines, never on chunking or threads.
* **Silent like torch.** Integer SUM/PRODUCT wrap around; float overflow gives
  inf. No RuntimeWarning.
* **NaN wins MIN/MAX**, as in ``torch.minimum``, whichever side holds it, so
  that every algorithm's combining order gives the same result. (gloo's
  result depends on the rank: with NaN on rank 0 it is NaN, on rank 1 the
  other value.)
* **Plain functions.** Nothing here awaits or blocks on I/O; any thread may
  call it. A kernel takes CPU time in proportion to the buffer (NumPy and
  torch release the GIL while they run).
* **Kernels trust check_op.** :func:`prepare`, :func:`combine` and
  :func:`finish` assume :func:`~asyncdist.reduce.op.check_op` passed for the op
  and dtype; they only assert what a collective, not a user, could get wrong
  (sizes, writability). What each op computes on each dtype, and how that
  compares with torch's gloo and NCCL, is in :mod:`asyncdist.reduce.op`.
"""

from __future__ import annotations

import importlib

from typing import Any, Callable

import numpy as np

from .._torch import torch_or_none
from ..buffers.host import ITEMSIZES, NUMPY_DTYPES, HostBuffer, numpy_view
from .op import (
    _NO_FACTOR,
    Factor,
    RedOpType,
    ReduceOp,
    _resolve,
    check_op,
    make_premul_sum,
    op_name,
    op_type,
)

__all__ = [
    "RedOpType",  # re-exported from reduce_op, with the four below
    "ReduceOp",
    "make_premul_sum",
    "op_type",
    "op_name",
    "check_op",
    "prepare",
    "combine",
    "folder",
    "finish",
]


# -- kernels -------------------------------------------------------------------

# On bool these are already the logical ops gloo computes: add = or,
# multiply = and, minimum = and, maximum = or, bitwise_* = logical_*.
_UFUNCS: dict[RedOpType, np.ufunc] = {
    RedOpType.SUM: np.add,
    RedOpType.AVG: np.add,
    RedOpType.PREMUL_SUM: np.add,
    RedOpType.PRODUCT: np.multiply,
    RedOpType.MIN: np.minimum,
    RedOpType.MAX: np.maximum,
    RedOpType.BAND: np.bitwise_and,
    RedOpType.BOR: np.bitwise_or,
    RedOpType.BXOR: np.bitwise_xor,
}

# Dtypes torch has no (complete) CPU kernels for: computed in the wide dtype.
_UPCAST: dict[str, str] = {
    "complex32": "complex64",
    **{name: "float32" for name in ITEMSIZES if name.startswith("float8_")},
}
# Elements per upcast step: 2 x 256 KiB of float32 temporaries, cache-sized.
_UPCAST_CHUNK = 1 << 16


def prepare(op: Any, buf: HostBuffer) -> None:
    """Ready a rank's own contribution: PREMUL_SUM multiplies it by the factor.

    Other ops leave ``buf`` alone.

    Args:
        op: an op that passed :func:`check_op` for ``buf.dtype``.
        buf: writable; overwritten in place.
    """
    if type(op) is RedOpType:  # a plain operator: only a PREMUL_SUM instance has a factor
        return
    kind, factor = _resolve(op)
    if kind is not RedOpType.PREMUL_SUM or buf.nbytes == 0:
        return
    assert factor is not None, _NO_FACTOR
    assert not buf.view.readonly, "prepare needs a writable buffer"
    a = numpy_view(buf, flat=True)
    if a is not None:
        with np.errstate(all="ignore"):
            np.multiply(a, a.dtype.type(factor), out=a)  # the factor in the dtype, as NCCL
        return
    scalar = _factor_in(buf.dtype, factor)
    _torch_apply(lambda x, _: x.mul_(scalar), buf)


def combine(op: Any, acc: HostBuffer, other: HostBuffer) -> None:
    """``acc[i] = op(acc[i], other[i])`` for every element, in place.

    AVG and PREMUL_SUM combine as SUM. Shapes may differ; dtype and size may not.

    Args:
        op: an op that passed :func:`check_op` for the dtype.
        acc: the accumulator, writable.
        other: the same dtype and number of bytes; read only.
    """
    assert acc.dtype == other.dtype and acc.nbytes == other.nbytes, (
        f"combine of {acc.dtype} ({acc.nbytes} bytes) with {other.dtype} ({other.nbytes} bytes)"
    )
    assert not acc.view.readonly, "combine needs a writable accumulator"
    kind = op if type(op) is RedOpType else _resolve(op)[0]
    if acc.nbytes == 0:
        return
    dtype = NUMPY_DTYPES.get(acc.dtype)
    if dtype is not None:  # numpy_view's flat arrays, made here: every small reduction passes
        a = np.frombuffer(acc.view, dtype)
        _apply_silently(_UFUNCS[kind], a, np.frombuffer(other.view, dtype))
        return
    _torch_combine(kind, acc, other)


def _torch_combine(kind: RedOpType, acc: HostBuffer, other: HostBuffer) -> None:
    """:func:`combine` for the dtypes NumPy lacks."""
    torch = torch_or_none()
    assert torch is not None
    if kind is RedOpType.PRODUCT:
        _torch_apply(lambda x, y: x.mul_(y), acc, other)
    elif kind is RedOpType.MIN:
        _torch_apply(lambda x, y: torch.minimum(x, y, out=x), acc, other)
    elif kind is RedOpType.MAX:
        _torch_apply(lambda x, y: torch.maximum(x, y, out=x), acc, other)
    else:  # SUM, AVG, PREMUL_SUM; torch-only dtypes have no bitwise ops
        _torch_apply(lambda x, y: x.add_(y), acc, other)


def folder(op: Any, acc: HostBuffer) -> Callable[[np.ndarray, int], None]:
    """A :data:`~asyncdist.transport.stream.Fold` that combines a received message
    into ``acc`` piece by piece: ``fold(piece, offset)`` runs :func:`combine`
    on the bytes of ``acc`` from ``offset``, with ``piece`` (uint8, whole
    elements) as the other operand.

    The engine calls it with each piece as it reads it, so the message is
    never written anywhere else first (see :class:`~asyncdist.engine.matching.PostedRecv`).
    """
    itemsize = ITEMSIZES[acc.dtype]
    kind = op if type(op) is RedOpType else _resolve(op)[0]
    whole = numpy_view(acc, flat=True)
    if whole is None:  # a dtype NumPy lacks: through torch, piece by piece

        def fold_through_torch(piece: np.ndarray, offset: int) -> None:
            assert offset % itemsize == 0 and piece.nbytes % itemsize == 0, "a piece of whole elements"
            start, count = offset // itemsize, piece.nbytes // itemsize
            _torch_combine(kind, acc.elements(start, start + count), HostBuffer(piece.data, acc.dtype, (count,)))

        return fold_through_torch
    ufunc, dtype = _UFUNCS[kind], whole.dtype

    def fold(piece: np.ndarray, offset: int) -> None:
        assert offset % itemsize == 0 and piece.nbytes % itemsize == 0, "a piece of whole elements"
        part = whole[offset // itemsize : (offset + piece.nbytes) // itemsize]
        _apply_silently(ufunc, part, piece.view(dtype))

    return fold


def finish(op: Any, acc: HostBuffer, world_size: int) -> None:
    """Complete a reduction: AVG divides by ``world_size``; other ops do nothing.

    True division, the result keeping the dtype. Call once, on the final result.

    Args:
        op: an op that passed :func:`check_op` for ``acc.dtype``.
        acc: the reduced buffer, writable.
        world_size: the number of contributions summed into ``acc`` (>= 1).
    """
    if (op if type(op) is RedOpType else _resolve(op)[0]) is not RedOpType.AVG or acc.nbytes == 0:
        return
    assert world_size >= 1 and not acc.view.readonly
    a = numpy_view(acc, flat=True)
    if a is not None:
        # float16 divides in float32 and rounds once, as torch's div_ does;
        # NumPy's default would round world_size to float16 (2049 -> 2048).
        opmath = np.float32 if a.dtype == np.float16 else None
        with np.errstate(all="ignore"):
            np.divide(a, world_size, out=a, dtype=opmath)
        return
    _torch_apply(lambda x, _: x.div_(world_size), acc)


# -- helpers -------------------------------------------------------------------


def _numpy_error_state() -> tuple[Any, Any] | None:
    """NumPy 2's floating-point error handling, a context variable, and its
    value under ``np.errstate(all="ignore")``; None before NumPy 2."""
    try:  # private, and not in NumPy's stubs
        _extobj_contextvar = importlib.import_module("numpy._core._ufunc_config")._extobj_contextvar
    except (ImportError, AttributeError):
        return None
    with np.errstate(all="ignore"):
        return _extobj_contextvar, _extobj_contextvar.get()


_ERROR_STATE = _numpy_error_state()

if _ERROR_STATE is None:

    def _apply_silently(ufunc: np.ufunc, acc: np.ndarray, other: np.ndarray) -> None:
        """``ufunc(acc, other, out=acc)`` with no RuntimeWarning (overflow gives inf, as in torch)."""
        with np.errstate(all="ignore"):
            ufunc(acc, other, out=acc)

else:
    # Every fold of a reduction passes here: setting NumPy's context variable
    # directly costs two C calls where ``np.errstate`` costs three Python calls.
    _state, _ignore = _ERROR_STATE

    def _apply_silently(ufunc: np.ufunc, acc: np.ndarray, other: np.ndarray) -> None:
        """``ufunc(acc, other, out=acc)`` with no RuntimeWarning (overflow gives inf, as in torch)."""
        token = _state.set(_ignore)
        try:
            ufunc(acc, other, out=acc)
        finally:
            _state.reset(token)


def _factor_in(dtype: str, factor: Factor) -> Factor:
    """``factor`` rounded to the torch-only ``dtype``, as an exact Python number."""
    if dtype == "complex32":  # pairs of float16, which NumPy has
        with np.errstate(all="ignore"):
            return complex(np.float16(factor.real), np.float16(factor.imag))
    torch = torch_or_none()
    assert torch is not None
    return torch.tensor(factor, dtype=torch.float64).to(getattr(torch, dtype)).item()


def _torch_view(torch: Any, buf: HostBuffer) -> Any:
    """A flat tensor of ``buf.dtype`` over ``buf``'s memory."""
    try:
        # DLPack, not torch.frombuffer: frombuffer warns on a read-only view,
        # which `other` often is. Nothing here writes through a read-only view.
        raw = torch.from_dlpack(np.frombuffer(buf.view, dtype=np.uint8))
    except BufferError:  # NumPy < 2.1 cannot export read-only memory: copy it
        raw = torch.frombuffer(bytearray(buf.view), dtype=torch.uint8)
    return raw.view(getattr(torch, buf.dtype))


def _torch_apply(
    fn: Callable[[Any, Any], object], acc: HostBuffer, other: HostBuffer | None = None
) -> None:
    """Run ``fn(x, y)`` in place on torch views of ``acc`` and ``other``.

    For dtypes in :data:`_UPCAST` ``fn`` sees wide copies of one chunk at a
    time, and the chunk of ``acc`` is overwritten with its rounded result.
    """
    torch = torch_or_none()
    assert torch is not None  # check_op guarantees it for torch-only dtypes
    x = _torch_view(torch, acc)
    y = None if other is None else _torch_view(torch, other)
    wide_name = _UPCAST.get(acc.dtype)
    if wide_name is None:
        fn(x, y)
        return
    wide = getattr(torch, wide_name)
    for start in range(0, x.numel(), _UPCAST_CHUNK):
        part = x[start : start + _UPCAST_CHUNK]
        result = part.to(wide)
        fn(result, None if y is None else y[start : start + _UPCAST_CHUNK].to(wide))
        part.copy_(result)

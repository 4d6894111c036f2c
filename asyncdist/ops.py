"""Reduction operators, the dtypes each is defined for, and their kernels.

This module owns the vocabulary of ``op=`` (:class:`RedOpType`, :class:`ReduceOp`
and :func:`make_premul_sum`, shaped like torch.distributed's), the rule of which
op applies to which dtype (:func:`check_op`), and the element-wise kernels that
the collective algorithms run on :class:`~asyncdist.buffers.HostBuffer` s. It
knows nothing of ranks, messages or algorithms: a collective validates once,
then drives the three steps of a reduction::

    check_op(op, buf.dtype)          # every rank, before anything moves
    prepare(op, own)                 # PREMUL_SUM: own *= factor
    combine(op, acc, received)       # acc = op(acc, received), any number of times
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
  :func:`finish` assume :func:`check_op` passed for the op and dtype; they only
  assert what a collective, not a user, could get wrong (sizes, writability).

What torch 2.13's gloo does, observed with two ranks (``file://`` rendezvous),
and what we do:

* bool: SUM = or, PRODUCT = and, MIN = and, MAX = or, BAND/BOR/BXOR logical.
  We match. NumPy's ufuncs on bool compute exactly these.
* AVG on bool and integer dtypes: gloo fails ("result type Float can't be cast
  to the desired output type Long"). We refuse it in :func:`check_op`.
* AVG on float16/bfloat16/float32/float64 and complex: sum, then true division
  by the world size in the dtype. We match; float16 divides in float32 and
  rounds once, as torch's ``div_`` does.
* complex: torch refuses PRODUCT, MIN, MAX and the bitwise ops ("all_reduce
  does not support RedOpType.PRODUCT on complex tensors": it reduces complex
  tensors as pairs of reals). We refuse MIN/MAX (complex numbers are not
  ordered) and the bitwise ops, and allow PRODUCT, which we compute as a
  complex product. AVG and PREMUL_SUM are allowed on complex (torch's NCCL
  allows both).
* PREMUL_SUM: gloo refuses it; NCCL multiplies each input by the factor,
  converted to the data type, then sums. We do the same on every backend.
* int16, uint16/32/64 and float8_*: gloo fails ("Invalid scalar type"). We
  reduce them.
"""

from __future__ import annotations

import enum
import numbers
from typing import Any, Callable, ClassVar

import numpy as np

from ._torch import is_torch_tensor, torch_or_none
from .buffers import ITEMSIZES, HostBuffer, numpy_view
from .errors import InvalidArgumentError

__all__ = [
    "RedOpType",
    "ReduceOp",
    "make_premul_sum",
    "op_type",
    "op_name",
    "check_op",
    "prepare",
    "combine",
    "finish",
]


class RedOpType(enum.IntEnum):
    """The reduction operators, with torch's names and values."""

    SUM = 0
    AVG = 1
    PRODUCT = 2
    MIN = 3
    MAX = 4
    BAND = 5
    BOR = 6
    BXOR = 7
    PREMUL_SUM = 8

    def __str__(self) -> str:  # torch prints "RedOpType.SUM"; IntEnum would print "0"
        return f"RedOpType.{self.name}"


Factor = float | complex


class ReduceOp:
    """A reduction operator, as ``torch.distributed.ReduceOp``.

    ``ReduceOp.SUM`` and the others are :class:`RedOpType` members, which every
    function here accepts directly; an instance wraps one, and a PREMUL_SUM
    instance (from :func:`make_premul_sum`) also carries its factor. As in
    torch, equality and hashing look at the operator only, so
    ``ReduceOp(ReduceOp.MAX) == ReduceOp.MAX`` and both find the same dict
    entry; :func:`op_name` is what tells two PREMUL_SUM factors apart.

    Example:
        >>> ReduceOp(ReduceOp.MAX) == ReduceOp.MAX, ReduceOp.RedOpType.SUM is ReduceOp.SUM
        (True, True)
    """

    __slots__ = ("op", "_factor")

    RedOpType: ClassVar[type[RedOpType]] = RedOpType
    SUM: ClassVar[RedOpType] = RedOpType.SUM
    AVG: ClassVar[RedOpType] = RedOpType.AVG
    PRODUCT: ClassVar[RedOpType] = RedOpType.PRODUCT
    MIN: ClassVar[RedOpType] = RedOpType.MIN
    MAX: ClassVar[RedOpType] = RedOpType.MAX
    BAND: ClassVar[RedOpType] = RedOpType.BAND
    BOR: ClassVar[RedOpType] = RedOpType.BOR
    BXOR: ClassVar[RedOpType] = RedOpType.BXOR
    PREMUL_SUM: ClassVar[RedOpType] = RedOpType.PREMUL_SUM

    op: RedOpType
    _factor: Factor | None

    def __init__(self, op: RedOpType | ReduceOp) -> None:
        """Wrap ``op``; a PREMUL_SUM needs :func:`make_premul_sum` instead.

        Raises:
            InvalidArgumentError: ``op`` is not an operator, or is a bare PREMUL_SUM.
        """
        self.op, self._factor = _resolve(op)
        if self.op is RedOpType.PREMUL_SUM and self._factor is None:
            raise InvalidArgumentError(_NO_FACTOR)

    @property
    def factor(self) -> Factor:
        """The PREMUL_SUM factor. Raises InvalidArgumentError for other ops (torch's words)."""
        if self._factor is None:
            raise InvalidArgumentError("Only PREMUL_SUM supports accessing factor")
        return self._factor

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ReduceOp):
            return self.op == other.op
        if isinstance(other, RedOpType):
            return self.op == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.op)

    def __repr__(self) -> str:
        return f"<ReduceOp {op_name(self)}>"

    def __reduce__(self) -> tuple[Callable[..., ReduceOp], tuple[RedOpType, Factor | None]]:
        return _new_reduce_op, (self.op, self._factor)


def _new_reduce_op(op: RedOpType, factor: Factor | None) -> ReduceOp:
    obj = object.__new__(ReduceOp)
    obj.op, obj._factor = op, factor
    return obj


def make_premul_sum(factor: float | complex) -> ReduceOp:
    """A PREMUL_SUM: each rank's input is multiplied by ``factor``, then all are summed.

    Like torch's ``dist._make_nccl_premul_sum``, but on every backend. The
    factor is converted to the data's dtype before multiplying, as NCCL does.

    Args:
        factor: a real number, or a complex one (for complex dtypes only); a
            one-element torch tensor is read once, now.

    Raises:
        InvalidArgumentError: ``factor`` is not a number.

    Example:
        >>> op_name(make_premul_sum(0.5))
        'premul_sum(0.5)'
    """
    if is_torch_tensor(factor) and factor.numel() == 1:
        factor = factor.item()
    if isinstance(factor, numbers.Complex) and not isinstance(factor, (bool, np.bool_)):
        exact = float(factor) if isinstance(factor, numbers.Real) else complex(factor)
        return _new_reduce_op(RedOpType.PREMUL_SUM, exact)
    raise InvalidArgumentError(
        f"the PREMUL_SUM factor must be a real or complex number, not {factor!r}"
    )


def op_type(op: Any) -> RedOpType:
    """The :class:`RedOpType` of ``op``.

    Args:
        op: a :class:`RedOpType` (``ReduceOp.SUM``), a :class:`ReduceOp`, or
            torch.distributed's own ``ReduceOp.SUM`` / ``ReduceOp`` instances,
            so that code mixing both imports works.

    Raises:
        InvalidArgumentError: ``op`` is none of these (plain ints included).
    """
    return _resolve(op)[0]


def op_name(op: Any) -> str:
    """A short name that ranks compare to detect mismatched ops.

    Example:
        >>> op_name(ReduceOp.SUM), op_name(make_premul_sum(0.25))
        ('sum', 'premul_sum(0.25)')
    """
    kind, factor = _resolve(op)
    name = kind.name.lower()
    return name if factor is None else f"{name}({factor!r})"


# -- dtype rules -------------------------------------------------------------

_BOOL, _INT, _FLOAT, _COMPLEX = "bool", "integer", "floating-point", "complex"

# Canonical dtype name -> kind. Names of ITEMSIZES missing here (bits*, the
# packed float4, the sub-byte integer shells) have no arithmetic in torch.
_KINDS: dict[str, str] = {
    "bool": _BOOL,
    **{f"{sign}int{bits}": _INT for sign in ("", "u") for bits in (8, 16, 32, 64)},
    **{name: _FLOAT for name in ("float16", "float32", "float64", "bfloat16")},
    **{name: _FLOAT for name in ITEMSIZES if name.startswith("float8_")},
    **{name: _COMPLEX for name in ("complex32", "complex64", "complex128")},
}

_ALL = frozenset({_BOOL, _INT, _FLOAT, _COMPLEX})
_ORDERED = frozenset({_BOOL, _INT, _FLOAT})
_BITWISE = frozenset({_BOOL, _INT})
_FRACTIONAL = frozenset({_FLOAT, _COMPLEX})

_UNORDERED = "complex numbers are not ordered"
_NOT_BITS = "bitwise ops need an integer or bool dtype"
_NOT_FRACTIONAL = "it needs a floating-point or complex dtype"

# Op -> (the kinds it is defined for, why it is not for the others).
_RULES: dict[RedOpType, tuple[frozenset[str], str]] = {
    RedOpType.SUM: (_ALL, ""),
    RedOpType.PRODUCT: (_ALL, ""),
    RedOpType.MIN: (_ORDERED, _UNORDERED),
    RedOpType.MAX: (_ORDERED, _UNORDERED),
    RedOpType.BAND: (_BITWISE, _NOT_BITS),
    RedOpType.BOR: (_BITWISE, _NOT_BITS),
    RedOpType.BXOR: (_BITWISE, _NOT_BITS),
    RedOpType.AVG: (_FRACTIONAL, f"{_NOT_FRACTIONAL} (for integers reduce with SUM and divide)"),
    RedOpType.PREMUL_SUM: (_FRACTIONAL, _NOT_FRACTIONAL),
}

_NO_FACTOR = "ReduceOp.PREMUL_SUM needs a factor: build it with make_premul_sum(factor)"


def check_op(op: Any, dtype: str) -> None:
    """Check that ``op`` is defined for ``dtype``; call before :func:`prepare`.

    See the module docstring for the rules and how they compare with torch.

    Args:
        op: anything :func:`op_type` accepts.
        dtype: a canonical dtype name (a key of ``ITEMSIZES``).

    Raises:
        InvalidArgumentError: naming the op and the dtype, e.g. "ReduceOp.BAND
            is not defined for dtype float32: bitwise ops need an integer or
            bool dtype"; also for a PREMUL_SUM without a factor, a complex
            factor on a real dtype, and a torch-only dtype without torch.
    """
    kind, factor = _resolve(op)
    what = f"ReduceOp.{kind.name} is not defined for dtype {dtype}"
    dtype_kind = _KINDS.get(dtype)
    if dtype_kind is None:
        known = "it has no arithmetic" if dtype in ITEMSIZES else "asyncdist does not know it"
        raise InvalidArgumentError(f"{what}: {known}")
    allowed, why = _RULES[kind]
    if dtype_kind not in allowed:
        raise InvalidArgumentError(f"{what}: {why}")
    if kind is RedOpType.PREMUL_SUM:
        if factor is None:
            raise InvalidArgumentError(_NO_FACTOR)
        if isinstance(factor, complex) and dtype_kind is not _COMPLEX:
            raise InvalidArgumentError(
                f"{what} with the complex factor {factor!r}: a complex factor needs a complex dtype"
            )
    if dtype in _TORCH_ONLY and torch_or_none() is None:
        raise InvalidArgumentError(f"{what} without torch: reducing {dtype} needs torch installed")


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
    **{name: "float32" for name in _KINDS if name.startswith("float8_")},
}
# Dtypes NumPy lacks, which only torch tensors carry.
_TORCH_ONLY = frozenset({"bfloat16", *_UPCAST})
# Elements per upcast step: 2 x 256 KiB of float32 temporaries, cache-sized.
_UPCAST_CHUNK = 1 << 16


def prepare(op: Any, buf: HostBuffer) -> None:
    """Ready a rank's own contribution: PREMUL_SUM multiplies it by the factor.

    Other ops leave ``buf`` alone.

    Args:
        op: an op that passed :func:`check_op` for ``buf.dtype``.
        buf: writable; overwritten in place.
    """
    kind, factor = _resolve(op)
    if kind is not RedOpType.PREMUL_SUM or buf.nbytes == 0:
        return
    assert factor is not None, _NO_FACTOR
    assert not buf.view.readonly, "prepare needs a writable buffer"
    a = _numpy_flat(buf)
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
    kind = op_type(op)
    if acc.nbytes == 0:
        return
    a = _numpy_flat(acc)
    if a is not None:
        with np.errstate(all="ignore"):
            _UFUNCS[kind](a, _numpy_flat(other), out=a)
        return
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


def finish(op: Any, acc: HostBuffer, world_size: int) -> None:
    """Complete a reduction: AVG divides by ``world_size``; other ops do nothing.

    True division, the result keeping the dtype. Call once, on the final result.

    Args:
        op: an op that passed :func:`check_op` for ``acc.dtype``.
        acc: the reduced buffer, writable.
        world_size: the number of contributions summed into ``acc`` (>= 1).
    """
    if op_type(op) is not RedOpType.AVG or acc.nbytes == 0:
        return
    assert world_size >= 1 and not acc.view.readonly
    a = _numpy_flat(acc)
    if a is not None:
        # float16 divides in float32 and rounds once, as torch's div_ does;
        # NumPy's default would round world_size to float16 (2049 -> 2048).
        opmath = np.float32 if a.dtype == np.float16 else None
        with np.errstate(all="ignore"):
            np.divide(a, world_size, out=a, dtype=opmath)
        return
    _torch_apply(lambda x, _: x.div_(world_size), acc)


# -- helpers -------------------------------------------------------------------


def _resolve(op: Any) -> tuple[RedOpType, Factor | None]:
    """``op`` as (operator, PREMUL_SUM factor or None)."""
    if type(op) is RedOpType:
        return op, None
    if isinstance(op, ReduceOp):
        return op.op, op._factor
    if type(op).__module__.startswith("torch"):
        # torch.distributed's RedOpType member, or its ReduceOp instance (.op).
        kind = RedOpType.__members__.get(getattr(getattr(op, "op", op), "name", None))
        if kind is RedOpType.PREMUL_SUM and hasattr(op, "op"):
            return kind, make_premul_sum(op.factor)._factor
        if kind is not None:
            return kind, None
    raise InvalidArgumentError(f"op must be a ReduceOp such as ReduceOp.SUM, not {op!r}")


def _numpy_flat(buf: HostBuffer) -> np.ndarray | None:
    a = numpy_view(buf)
    return None if a is None else a.reshape(-1)


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

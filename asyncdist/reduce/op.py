"""Reduction operators and the dtypes each is defined for.

This module owns the vocabulary of ``op=`` (:class:`RedOpType`, :class:`ReduceOp`
and :func:`make_premul_sum`, shaped like torch.distributed's), the names ranks
compare to detect mismatched ops (:func:`op_name`), and the rule of which op
applies to which dtype (:func:`check_op`). It knows nothing of buffers, ranks,
messages or algorithms, and computes nothing: the element-wise kernels that
carry an op out live in :mod:`asyncdist.reduce.kernels`, and trust :func:`check_op`.

Invariants:

* **Equality is the operator's.** Two :class:`ReduceOp` s are equal, and hash
  alike, when their :class:`RedOpType` is, as in torch; only :func:`op_name`
  tells two PREMUL_SUM factors apart.
* **One resolver.** Every function here accepts a :class:`RedOpType`, a
  :class:`ReduceOp`, or torch.distributed's own ``ReduceOp`` values, and reads
  them through :func:`_resolve` alone; plain ints are refused.
* **A PREMUL_SUM has a factor.** :class:`ReduceOp` refuses a bare PREMUL_SUM;
  :func:`make_premul_sum` stores the factor as an exact ``float`` or
  ``complex``.
* **Refuse, never warn.** An op that does not apply to a dtype is an
  :class:`~asyncdist.errors.InvalidArgumentError` naming both, raised before
  anything moves.
* **Plain functions.** Nothing here awaits, blocks or allocates in proportion
  to data; any thread may call it. torch is consulted only through
  :mod:`asyncdist._torch`.

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
from typing import TYPE_CHECKING, Any, Callable, ClassVar

import numpy as np

from .._torch import is_torch_tensor, torch_or_none
from ..buffers.host import ITEMSIZES
from ..errors import InvalidArgumentError

if TYPE_CHECKING:
    from torch import Tensor

__all__ = [
    "RedOpType",
    "ReduceOp",
    "make_premul_sum",
    "op_type",
    "own_op",
    "op_name",
    "check_op",
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

# ReduceOp's body names its own class attribute ``RedOpType``, which hides the
# enum there; its annotations use this alias instead.
_Kind = RedOpType


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

    RedOpType: ClassVar[type[_Kind]] = _Kind
    SUM: ClassVar[_Kind] = _Kind.SUM
    AVG: ClassVar[_Kind] = _Kind.AVG
    PRODUCT: ClassVar[_Kind] = _Kind.PRODUCT
    MIN: ClassVar[_Kind] = _Kind.MIN
    MAX: ClassVar[_Kind] = _Kind.MAX
    BAND: ClassVar[_Kind] = _Kind.BAND
    BOR: ClassVar[_Kind] = _Kind.BOR
    BXOR: ClassVar[_Kind] = _Kind.BXOR
    PREMUL_SUM: ClassVar[_Kind] = _Kind.PREMUL_SUM

    op: _Kind
    _factor: Factor | None

    def __init__(self, op: _Kind | ReduceOp) -> None:
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
        if isinstance(other, _Kind):
            return self.op == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.op)

    def __repr__(self) -> str:
        return f"<ReduceOp {op_name(self)}>"

    def __reduce__(self) -> tuple[Callable[..., ReduceOp], tuple[_Kind, Factor | None]]:
        return _new_reduce_op, (self.op, self._factor)


def _new_reduce_op(op: RedOpType, factor: Factor | None) -> ReduceOp:
    obj = object.__new__(ReduceOp)
    obj.op, obj._factor = op, factor
    return obj


def make_premul_sum(factor: float | complex | Tensor) -> ReduceOp:
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
    return op if type(op) is RedOpType else _resolve(op)[0]


def own_op(op: Any) -> RedOpType | ReduceOp:
    """``op`` in asyncdist's own terms: its :class:`RedOpType`, or a
    :class:`ReduceOp` for PREMUL_SUM. For torch.distributed's ops, which every
    step of a call would otherwise resolve again (the torch backend's).

    Raises:
        InvalidArgumentError: as :func:`op_type`.
    """
    kind, factor = _resolve(op)
    return kind if factor is None else _new_reduce_op(kind, factor)


def op_name(op: Any) -> str:
    """A short name that ranks compare to detect mismatched ops.

    Example:
        >>> op_name(ReduceOp.SUM), op_name(make_premul_sum(0.25))
        ('sum', 'premul_sum(0.25)')
    """
    if type(op) is RedOpType:
        return _LOWER_NAMES[op]
    kind, factor = _resolve(op)
    return _LOWER_NAMES[kind] if factor is None else f"{_LOWER_NAMES[kind]}({factor!r})"


_LOWER_NAMES = {kind: kind.name.lower() for kind in RedOpType}  # enum's .name is slow per call
_BY_NAME = {kind.name: kind for kind in RedOpType}  # so is its __members__


def _resolve(op: Any) -> tuple[RedOpType, Factor | None]:
    """``op`` as (operator, PREMUL_SUM factor or None); the kernels read ops through it too.

    Callers test for a plain :class:`RedOpType` first (``ReduceOp.SUM``, the
    common case), which is its own operator, without a call."""
    if type(op) is RedOpType:
        return op, None
    if isinstance(op, ReduceOp):
        return op.op, op._factor
    if type(op).__module__.startswith("torch"):
        # torch.distributed's RedOpType member, or its ReduceOp instance (.op).
        kind = _BY_NAME.get(getattr(getattr(op, "op", op), "name", ""))
        if kind is RedOpType.PREMUL_SUM and hasattr(op, "op"):
            return kind, make_premul_sum(op.factor)._factor
        if kind is not None:
            return kind, None
    raise InvalidArgumentError(f"op must be a ReduceOp such as ReduceOp.SUM, not {op!r}")


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

# Dtypes NumPy lacks, which only torch tensors carry: reducing them needs torch.
_TORCH_ONLY = frozenset(
    {"bfloat16", "complex32", *(name for name in _KINDS if name.startswith("float8_"))}
)

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


def check_op(op: Any, dtype: str) -> str:
    """Check that ``op`` is defined for ``dtype``; call before :func:`~asyncdist.reduce.kernels.prepare`.

    See the module docstring for the rules and how they compare with torch.

    Args:
        op: anything :func:`op_type` accepts.
        dtype: a canonical dtype name (a key of ``ITEMSIZES``).

    Returns:
        The op's name, as :func:`op_name` gives it (what a call's description carries).

    Raises:
        InvalidArgumentError: naming the op and the dtype, e.g. "ReduceOp.BAND
            is not defined for dtype float32: bitwise ops need an integer or
            bool dtype"; also for a PREMUL_SUM without a factor, a complex
            factor on a real dtype, and a torch-only dtype without torch.
    """
    kind, factor = (op, None) if type(op) is RedOpType else _resolve(op)
    dtype_kind = _KINDS.get(dtype)
    allowed, why = _RULES[kind]
    if dtype_kind is None:
        known = "it has no arithmetic" if dtype in ITEMSIZES else "asyncdist does not know it"
        raise InvalidArgumentError(f"{_undefined(kind, dtype)}: {known}")
    if dtype_kind not in allowed:
        raise InvalidArgumentError(f"{_undefined(kind, dtype)}: {why}")
    if kind is RedOpType.PREMUL_SUM:
        if factor is None:
            raise InvalidArgumentError(_NO_FACTOR)
        if isinstance(factor, complex) and dtype_kind is not _COMPLEX:
            raise InvalidArgumentError(
                f"{_undefined(kind, dtype)} with the complex factor {factor!r}: a complex factor needs a complex dtype"
            )
    if dtype in _TORCH_ONLY and torch_or_none() is None:
        raise InvalidArgumentError(f"{_undefined(kind, dtype)} without torch: reducing {dtype} needs torch installed")
    return _LOWER_NAMES[kind] if factor is None else f"{_LOWER_NAMES[kind]}({factor!r})"


def _undefined(kind: RedOpType, dtype: str) -> str:
    """The start of check_op's messages (built only for an error: every call checks)."""
    return f"ReduceOp.{kind.name} is not defined for dtype {dtype}"

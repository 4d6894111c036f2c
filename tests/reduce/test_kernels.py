"""Tests for asyncdist.reduce.kernels: every op on every dtype against an independent
reference, the dtype rules, and ReduceOp's torch-compatible surface.

The references here do not share code with the implementation: integer and
bool results are computed exactly with Python ints / any / all, floats in the
same pairwise order with NumPy operators on fresh arrays (so results must be
bit-identical, but for complex products: see :func:`assert_pairwise`) and
again in float64 within a rounding bound. Dtypes NumPy lacks are computed in
float32 / complex64 and rounded with torch's casts.
"""

from __future__ import annotations

import functools
import operator
import pickle
import tracemalloc
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from asyncdist.reduce import kernels as ops
from asyncdist._torch import torch_or_none
from asyncdist.buffers.host import as_host_buffer, numpy_view
from asyncdist.errors import InvalidArgumentError
from asyncdist.reduce.kernels import RedOpType, ReduceOp, make_premul_sum
from asyncdist.reduce.op import own_op

torch = torch_or_none()
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

INTS = ["uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64"]
NUMPY_FLOATS = ["float16", "float32", "float64"]
NUMPY_COMPLEX = ["complex64", "complex128"]
NUMPY_DTYPES = ["bool", *INTS, *NUMPY_FLOATS, *NUMPY_COMPLEX]
FLOAT8 = ["float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu"]
TORCH_ONLY = ["bfloat16", "complex32", *FLOAT8]
COMPLEX = ["complex32", *NUMPY_COMPLEX]
# Machine epsilon of each floating dtype (of the components, for complex).
EPS = {
    "float16": 2.0**-10, "float32": 2.0**-23, "float64": 2.0**-52, "bfloat16": 2.0**-7,
    "float8_e4m3fn": 2.0**-3, "float8_e4m3fnuz": 2.0**-3, "float8_e5m2": 2.0**-2,
    "float8_e5m2fnuz": 2.0**-2, "float8_e8m0fnu": 1.0,
    "complex32": 2.0**-10, "complex64": 2.0**-23, "complex128": 2.0**-52,
}  # fmt: skip
BITWISE = {RedOpType.BAND, RedOpType.BOR, RedOpType.BXOR}
REAL_FACTOR, COMPLEX_FACTOR = 0.3, 0.3 - 0.7j
SHAPES = [(7,), (), (3, 4), (0,), (2, 3, 5)]
COMPLEX_HALF_WARNING = "ignore:ComplexHalf support is experimental:UserWarning"


def kind_of(dtype: str) -> str:
    if dtype == "bool":
        return "bool"
    if dtype in INTS:
        return "int"
    return "complex" if dtype in COMPLEX else "float"


def defined(kind: RedOpType, dtype: str) -> bool:
    """The rules, restated: which op applies to which dtype."""
    k = kind_of(dtype)
    if kind in (RedOpType.MIN, RedOpType.MAX):
        return k != "complex"
    if kind in BITWISE:
        return k in ("bool", "int")
    if kind in (RedOpType.AVG, RedOpType.PREMUL_SUM):
        return k in ("float", "complex")
    return True  # SUM, PRODUCT


def the_op(kind: RedOpType, dtype: str) -> Any:
    if kind is not RedOpType.PREMUL_SUM:
        return kind
    return make_premul_sum(COMPLEX_FACTOR if dtype in COMPLEX else REAL_FACTOR)


def dtype_param(dtype: str) -> Any:
    marks = [needs_torch] if dtype in TORCH_ONLY else []
    if dtype == "complex32":  # creating complex32 test tensors warns, once per process
        marks.append(pytest.mark.filterwarnings(COMPLEX_HALF_WARNING))
    return pytest.param(dtype, marks=marks, id=dtype)


ALL_DTYPES = [dtype_param(d) for d in NUMPY_DTYPES + TORCH_ONLY]


def op_dtype_pairs(want_defined: bool) -> list[Any]:
    return [
        pytest.param(kind, p.values[0], marks=p.marks, id=f"{kind.name}-{p.values[0]}")
        for p in ALL_DTYPES
        for kind in RedOpType
        if defined(kind, p.values[0]) == want_defined
    ]


# -- data and reference ------------------------------------------------------


def wide_name(dtype: str) -> str:
    return "complex64" if dtype in COMPLEX else "float32"


def random_values(rng: np.random.Generator, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Values of ``dtype`` as a NumPy array (of the wide dtype for torch-only ones)."""
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype in INTS:  # the full range, so that SUM and PRODUCT wrap around
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)

    def reals() -> np.ndarray:  # magnitudes in [0.5, 2]: no overflow in a product of 5
        sign = 1.0 if dtype == "float8_e8m0fnu" else rng.choice([-1.0, 1.0], size=shape)
        return sign * rng.uniform(0.5, 2.0, size=shape)

    values = reals() + 1j * reals() if dtype in COMPLEX else reals()
    if dtype in TORCH_ONLY:
        return round_to(dtype, values.astype(wide_name(dtype)))
    return values.astype(dtype)


def round_to(dtype: str, wide: np.ndarray) -> np.ndarray:
    """``wide`` rounded to torch-only ``dtype`` (torch's cast), back in the wide dtype."""
    t = torch.from_numpy(np.ascontiguousarray(wide)).to(getattr(torch, dtype))
    return t.to(getattr(torch, wide_name(dtype))).numpy()


def as_object(values: np.ndarray, dtype: str) -> Any:
    """The user's object holding ``values``: a NumPy array, or a torch tensor."""
    if dtype in TORCH_ONLY:
        return torch.from_numpy(np.ascontiguousarray(values)).to(getattr(torch, dtype))
    return np.array(values)  # a copy, and an array even for shape ()


def values_of(obj: Any, dtype: str) -> np.ndarray:
    if dtype in TORCH_ONLY:
        return obj.to(getattr(torch, wide_name(dtype))).numpy()
    return obj


def exact_int(kind: RedOpType, dtype: str, arrays: list[np.ndarray]) -> np.ndarray:
    """Reduce with Python ints, then wrap into the dtype as two's complement does."""
    step = {
        RedOpType.SUM: operator.add, RedOpType.PRODUCT: operator.mul,
        RedOpType.MIN: min, RedOpType.MAX: max,
        RedOpType.BAND: operator.and_, RedOpType.BOR: operator.or_, RedOpType.BXOR: operator.xor,
    }[kind]  # fmt: skip
    bits = np.iinfo(dtype).bits
    offset = 2 ** (bits - 1) if np.iinfo(dtype).min < 0 else 0
    columns = zip(*(a.reshape(-1).tolist() for a in arrays))
    flat = [(functools.reduce(step, col) + offset) % 2**bits - offset for col in columns]
    return np.array(flat, dtype=dtype).reshape(arrays[0].shape)


def exact_bool(kind: RedOpType, arrays: list[np.ndarray]) -> np.ndarray:
    stack = np.stack(arrays)
    if kind in (RedOpType.SUM, RedOpType.MAX, RedOpType.BOR):
        return stack.any(axis=0)
    if kind in (RedOpType.PRODUCT, RedOpType.MIN, RedOpType.BAND):
        return stack.all(axis=0)
    return stack.sum(axis=0) % 2 == 1  # BXOR


def pairwise_float(kind: RedOpType, dtype: str, arrays: list[np.ndarray]) -> np.ndarray:
    """The reduction in the same pairwise order as the test drives it, in the dtype."""
    if dtype in TORCH_ONLY:
        rnd = functools.partial(round_to, dtype)
    else:
        rnd = lambda x: np.asarray(x, dtype=dtype)  # noqa: E731
    if kind is RedOpType.PREMUL_SUM:
        factor = COMPLEX_FACTOR if dtype in COMPLEX else REAL_FACTOR
        if dtype == "complex32":
            f = complex(torch.tensor(factor, dtype=torch.complex64).to(torch.complex32).item())
        elif dtype in TORCH_ONLY:
            f = torch.tensor(factor, dtype=torch.float32).to(getattr(torch, dtype)).item()
        else:
            f = np.array(factor, dtype=dtype)[()]
        arrays = [rnd(a * f) for a in arrays]
    step = {
        RedOpType.PRODUCT: operator.mul,
        RedOpType.MIN: lambda a, b: np.where(b < a, b, a),
        RedOpType.MAX: lambda a, b: np.where(b > a, b, a),
    }.get(kind, operator.add)
    acc = arrays[0]
    for b in arrays[1:]:
        acc = rnd(step(acc, b))
    if kind is RedOpType.AVG:
        n = len(arrays)
        acc = rnd(acc.astype(np.float32) / np.float32(n)) if dtype == "float16" else rnd(acc / n)
    return acc


def complex_products(kind: RedOpType, dtype: str) -> bool:
    return dtype in COMPLEX and kind in (RedOpType.PRODUCT, RedOpType.PREMUL_SUM)


def assert_pairwise(kind: RedOpType, dtype: str, arrays: list[np.ndarray], got: np.ndarray) -> None:
    """``got`` is the pairwise reduction, bit for bit.

    Except complex products, which agree to rounding only: NumPy's complex
    multiply loops differ in the last bit (one fuses a multiply-add; with
    NumPy 2.4, ``np.multiply(b, s, out=b)`` on a 1-element complex64 ``b``
    gives 176935.9-412848.47j where ``b * s`` gives 176935.9-412848.5j).
    """
    expected = pairwise_float(kind, dtype, arrays)
    assert got.dtype == expected.dtype
    if not complex_products(kind, dtype):
        np.testing.assert_array_equal(got, expected)
        return
    wide = [a.astype(np.complex128) for a in arrays]
    if kind is RedOpType.PRODUCT:
        scale = abs(functools.reduce(operator.mul, wide))
    else:
        scale = abs(COMPLEX_FACTOR) * functools.reduce(operator.add, [abs(a) for a in wide])
    assert np.all(abs(got.astype(np.complex128) - expected) <= 4 * len(arrays) * EPS[dtype] * scale)


def check_close_to_exact(
    kind: RedOpType, dtype: str, arrays: list[np.ndarray], got: np.ndarray
) -> None:
    """|got - exact| within the rounding error of n steps in the dtype."""
    x = [a.astype(np.complex128 if dtype in COMPLEX else np.float64) for a in arrays]
    n, eps = len(x), EPS[dtype]
    scale = functools.reduce(operator.add, [abs(a) for a in x])
    if kind is RedOpType.PRODUCT:
        exact = functools.reduce(operator.mul, x)
        scale = abs(exact)
    elif kind is RedOpType.MIN:
        exact, eps = functools.reduce(np.minimum, x), 0.0
    elif kind is RedOpType.MAX:
        exact, eps = functools.reduce(np.maximum, x), 0.0
    elif kind is RedOpType.AVG:
        exact, scale = sum(x) / n, scale / n
    elif kind is RedOpType.PREMUL_SUM:
        factor = COMPLEX_FACTOR if dtype in COMPLEX else REAL_FACTOR
        exact, scale = factor * sum(x), abs(factor) * scale
    else:
        exact = sum(x)
    assert np.all(abs(got - exact) <= 4 * (n + 1) * eps * scale)


# -- every op on every dtype -----------------------------------------------------


@pytest.mark.parametrize(("kind", "dtype"), op_dtype_pairs(True))
def test_reduce_matches_reference(kind: RedOpType, dtype: str) -> None:
    op = the_op(kind, dtype)
    ops.check_op(op, dtype)
    rng = np.random.default_rng([int(kind), len(dtype), sum(map(ord, dtype))])
    for n, shape in enumerate(SHAPES, start=1):
        arrays = [random_values(rng, dtype, shape) for _ in range(n)]
        # Drive the ops as a collective does: prepare each contribution,
        # combine into the first one, finish once.
        objs = [as_object(a, dtype) for a in arrays]
        for obj in objs:
            ops.prepare(op, as_host_buffer(obj, writable=True))
        acc = as_host_buffer(objs[0], writable=True)
        for obj in objs[1:]:
            ops.combine(op, acc, as_host_buffer(obj))  # read-only, as received data may be
        ops.finish(op, acc, n)
        got = values_of(objs[0], dtype)  # the user's own object holds the result

        if dtype == "bool":
            np.testing.assert_array_equal(got, exact_bool(kind, arrays))
        elif dtype in INTS:
            np.testing.assert_array_equal(got, exact_int(kind, dtype, arrays))
        else:
            assert_pairwise(kind, dtype, arrays, got)
            check_close_to_exact(kind, dtype, arrays, got)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(NUMPY_DTYPES), n=st.integers(1, 5))
def test_reduce_any_values(data: st.DataObject, dtype: str, n: int) -> None:
    """Any shape and any values, inf and NaN included: still the pairwise result."""
    kind = data.draw(st.sampled_from([k for k in RedOpType if defined(k, dtype)]))
    op = the_op(kind, dtype)
    shape = data.draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
    elements = None  # any value of the dtype, inf and NaN included
    if complex_products(kind, dtype):  # compared within a bound: keep it finite
        width = 8 * np.dtype(dtype).itemsize
        elements = st.complex_numbers(
            max_magnitude=1e6, allow_infinity=False, allow_nan=False, width=width
        )
    arrays = [data.draw(hnp.arrays(dtype, shape, elements=elements)) for _ in range(n)]
    acc_array = arrays[0].copy()
    acc = as_host_buffer(acc_array, writable=True)
    ops.prepare(op, acc)
    for a in arrays[1:]:
        other = a.copy()
        ops.prepare(op, as_host_buffer(other, writable=True))
        ops.combine(op, acc, as_host_buffer(other))
    ops.finish(op, acc, n)
    if dtype == "bool":
        np.testing.assert_array_equal(acc_array, exact_bool(kind, arrays))
    elif dtype in INTS:
        np.testing.assert_array_equal(acc_array, exact_int(kind, dtype, arrays))
    elif kind not in (RedOpType.MIN, RedOpType.MAX):  # NaN rules: see test_min_max_propagate_nan
        with np.errstate(all="ignore"):  # inf - inf and overflow, on purpose
            assert_pairwise(kind, dtype, arrays, acc_array)


# -- dtype rules ---------------------------------------------------------------


@pytest.mark.parametrize(("kind", "dtype"), op_dtype_pairs(False))
def test_check_op_refuses(kind: RedOpType, dtype: str) -> None:
    with pytest.raises(InvalidArgumentError, match=rf"ReduceOp\.{kind.name} .*dtype {dtype}\b"):
        ops.check_op(the_op(kind, dtype), dtype)


@pytest.mark.parametrize("dtype", ["bits8", "float4_e2m1fn_x2", "uint3", "int1"])
def test_check_op_refuses_dtypes_without_arithmetic(dtype: str) -> None:
    message = rf"ReduceOp\.SUM .*{dtype}: it has no arithmetic"
    with pytest.raises(InvalidArgumentError, match=message):
        ops.check_op(ReduceOp.SUM, dtype)


def test_check_op_premul_sum_factor() -> None:
    with pytest.raises(InvalidArgumentError, match="needs a factor.*make_premul_sum"):
        ops.check_op(ReduceOp.PREMUL_SUM, "float32")
    message = r"PREMUL_SUM .*float64 .*complex factor \(1\+2j\)"
    with pytest.raises(InvalidArgumentError, match=message):
        ops.check_op(make_premul_sum(1 + 2j), "float64")
    ops.check_op(make_premul_sum(1 + 2j), "complex128")
    ops.check_op(make_premul_sum(2), "complex64")  # a real factor suits complex data


def test_check_op_rejects_unknown_dtypes_and_non_ops() -> None:
    with pytest.raises(InvalidArgumentError, match="float128: asyncdist does not know it"):
        ops.check_op(ReduceOp.SUM, "float128")
    for bad in (0, 3, True, "sum", None, 1.5):
        with pytest.raises(InvalidArgumentError, match="must be a ReduceOp"):
            ops.check_op(bad, "float32")


# -- specific semantics ----------------------------------------------------------


def test_avg_and_premul_sum_values() -> None:
    a, b = np.array([1.0, 4.0, -2.0]), np.array([2.0, 8.0, 5.0])
    acc = as_host_buffer(a, writable=True)
    ops.combine(ReduceOp.AVG, acc, as_host_buffer(b))
    ops.finish(ReduceOp.AVG, acc, 2)
    np.testing.assert_array_equal(a, [1.5, 6.0, 1.5])

    op = make_premul_sum(0.5)
    x, y = np.array([2.0, 4.0], np.float32), np.array([6.0, -8.0], np.float32)
    for arr in (x, y):
        ops.prepare(op, as_host_buffer(arr, writable=True))
    ops.combine(op, as_host_buffer(x, writable=True), as_host_buffer(y))
    ops.finish(op, as_host_buffer(x, writable=True), 2)  # no division for PREMUL_SUM
    np.testing.assert_array_equal(x, [4.0, -2.0])

    z = np.array([1 + 1j, 2j], np.complex64)
    ops.prepare(make_premul_sum(1j), as_host_buffer(z, writable=True))
    np.testing.assert_array_equal(z, [-1 + 1j, -2])


def test_avg_float16_divides_by_the_exact_world_size() -> None:
    # float16 cannot hold 2049: dividing by float16(2049) == 2048 would give 1.0.
    a = np.full(3, 2048, np.float16)
    ops.finish(ReduceOp.AVG, as_host_buffer(a, writable=True), 2049)
    np.testing.assert_array_equal(a, np.float16(1 - 2.0**-11))


def test_overflow_is_silent() -> None:
    """Wrap-around and inf as in torch; no RuntimeWarning (filterwarnings=error)."""
    h = np.array([65504.0, -65504.0], np.float16)
    ops.combine(ReduceOp.SUM, as_host_buffer(h, writable=True), as_host_buffer(h.copy()))
    np.testing.assert_array_equal(h, [np.inf, -np.inf])
    big = np.array([np.finfo(np.float32).max], np.float32)
    ops.prepare(make_premul_sum(1e300), as_host_buffer(big, writable=True))
    assert np.isinf(big).all()
    i = np.array([127, -128], np.int8)
    two = np.array([2, 2], np.int8)
    ops.combine(ReduceOp.PRODUCT, as_host_buffer(i, writable=True), as_host_buffer(two))
    np.testing.assert_array_equal(i, [-2, 0])


@pytest.mark.parametrize("dtype", [dtype_param(d) for d in ("float32", "bfloat16", "float8_e5m2")])
def test_min_max_propagate_nan(dtype: str) -> None:
    """NaN wins on either side (gloo keeps it only when rank 0 holds it)."""
    values = np.float32 if dtype in TORCH_ONLY else dtype
    for kind in (RedOpType.MIN, RedOpType.MAX):
        acc = as_object(np.array([np.nan, 1.0, 2.0], values), dtype)
        other = as_object(np.array([1.0, np.nan, 3.0], values), dtype)
        ops.combine(kind, as_host_buffer(acc, writable=True), as_host_buffer(other))
        got = values_of(acc, dtype)
        assert np.isnan(got[:2]).all() and got[2] == (2.0 if kind is RedOpType.MIN else 3.0)


def test_combine_ignores_shape_and_handles_empty() -> None:
    a, b = np.arange(12, dtype=np.int32).reshape(3, 4), np.ones(12, np.int32)
    ops.combine(ReduceOp.SUM, as_host_buffer(a, writable=True), as_host_buffer(b))
    np.testing.assert_array_equal(a.ravel(), np.arange(1, 13))
    for dtype in ["float32"] + (["bfloat16", "float8_e4m3fn"] if torch is not None else []):
        empty = as_host_buffer(as_object(np.zeros(0, np.float32), dtype), writable=True)
        ops.prepare(make_premul_sum(2.0), empty)
        ops.combine(ReduceOp.MAX, empty, empty)
        ops.finish(ReduceOp.AVG, empty, 3)


def test_combine_asserts_matching_buffers() -> None:
    acc = as_host_buffer(np.zeros(4, np.float32), writable=True)
    with pytest.raises(AssertionError, match="float32 .*float64"):
        ops.combine(ReduceOp.SUM, acc, as_host_buffer(np.zeros(4, np.float64)))
    with pytest.raises(AssertionError, match="writable"):
        ops.combine(ReduceOp.SUM, as_host_buffer(np.zeros(4, np.float32)), acc)


# -- zero copy and memory ----------------------------------------------------------


@pytest.mark.parametrize("dtype", [dtype_param(d) for d in ("float64", "bfloat16", "float8_e4m3fn")])
def test_results_land_in_the_callers_memory(dtype: str) -> None:
    n = 3 * (1 << 16) + 5  # several upcast chunks and a ragged tail
    ones = np.ones(n, np.float32)
    acc_obj, other = as_object(ones, dtype), as_object(ones * 2, dtype)
    acc = as_host_buffer(acc_obj, writable=True)
    before = acc.view
    ops.combine(ReduceOp.SUM, acc, as_host_buffer(other))
    ops.finish(ReduceOp.AVG, acc, 2)
    assert acc.view is before  # HostBuffer is frozen: nothing can replace its memory
    np.testing.assert_array_equal(values_of(acc_obj, dtype), np.full(n, 1.5))
    if dtype not in TORCH_ONLY:
        assert np.shares_memory(numpy_view(acc), acc_obj)


def test_numpy_kernels_allocate_nothing_per_element() -> None:
    n = 16 * 1024 * 1024  # 64 MiB of float32
    a, b = np.ones(n, np.float32), np.full(n, 2.0, np.float32)
    acc, other = as_host_buffer(a, writable=True), as_host_buffer(b)
    tracemalloc.start()
    try:
        np.add(a[: n // 4], b[: n // 4])  # tracemalloc sees NumPy's data allocations
        assert tracemalloc.get_traced_memory()[1] >= a.nbytes // 4
        tracemalloc.reset_peak()
        ops.prepare(make_premul_sum(0.5), acc)
        ops.combine(ReduceOp.SUM, acc, other)
        ops.finish(ReduceOp.AVG, acc, 2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024, peak
    assert a[0] == a[-1] == 1.25


# -- ReduceOp and the names ----------------------------------------------------------


def test_reduce_op_is_torch_shaped() -> None:
    assert [(k.name, k.value) for k in RedOpType] == [
        ("SUM", 0), ("AVG", 1), ("PRODUCT", 2), ("MIN", 3), ("MAX", 4),
        ("BAND", 5), ("BOR", 6), ("BXOR", 7), ("PREMUL_SUM", 8),
    ]  # fmt: skip
    assert ReduceOp.RedOpType is RedOpType
    assert ReduceOp.SUM is RedOpType.SUM and ReduceOp.SUM == RedOpType.SUM
    assert str(ReduceOp.MAX) == "RedOpType.MAX"
    table = {ReduceOp.SUM: "s", ReduceOp.MAX: "m"}
    assert table[ReduceOp(ReduceOp.MAX)] == "m" and table[RedOpType.SUM] == "s"
    assert ReduceOp(ReduceOp.MAX) == ReduceOp.MAX == ReduceOp(ReduceOp.MAX)
    assert ReduceOp(ReduceOp.MAX) != ReduceOp.MIN and ReduceOp(ReduceOp.SUM) != 0
    assert make_premul_sum(2.0) == ReduceOp.PREMUL_SUM  # as torch: the operator only
    assert make_premul_sum(2.0).factor == 2.0
    with pytest.raises(InvalidArgumentError, match="Only PREMUL_SUM supports accessing factor"):
        ReduceOp(ReduceOp.SUM).factor
    with pytest.raises(InvalidArgumentError, match="make_premul_sum"):
        ReduceOp(ReduceOp.PREMUL_SUM)
    for op in (ReduceOp(ReduceOp.BXOR), make_premul_sum(-0.25), make_premul_sum(1j)):
        back = pickle.loads(pickle.dumps(op))
        assert back == op and ops.op_name(back) == ops.op_name(op)
    assert repr(make_premul_sum(0.5)) == "<ReduceOp premul_sum(0.5)>"


def test_op_name_and_op_type() -> None:
    assert [ops.op_name(k) for k in RedOpType if k is not RedOpType.PREMUL_SUM] == [
        "sum", "avg", "product", "min", "max", "band", "bor", "bxor",
    ]  # fmt: skip
    assert ops.op_name(make_premul_sum(0.5)) == "premul_sum(0.5)"
    assert ops.op_name(make_premul_sum(np.float32(0.25))) == "premul_sum(0.25)"
    assert ops.op_name(make_premul_sum(3)) == "premul_sum(3.0)"
    assert ops.op_name(make_premul_sum(1 - 2j)) == "premul_sum((1-2j))"
    # Factors that differ in the last bit have different names (repr round-trips).
    assert ops.op_name(make_premul_sum(0.1)) != ops.op_name(make_premul_sum(np.nextafter(0.1, 1)))
    assert ops.op_type(ReduceOp(ReduceOp.BOR)) is RedOpType.BOR
    assert ops.op_type(make_premul_sum(1.0)) is RedOpType.PREMUL_SUM
    for bad in ("x", True, np.True_, None):
        with pytest.raises(InvalidArgumentError, match="factor must be a real or complex number"):
            make_premul_sum(bad)


@needs_torch
def test_torch_reduce_ops_are_accepted() -> None:
    import torch.distributed as tdist  # noqa: PLC0415 (torch is installed: checked above)

    for k in RedOpType:
        assert ops.op_type(getattr(tdist.ReduceOp, k.name)) is k
    assert ops.op_type(tdist.ReduceOp(tdist.ReduceOp.MIN)) is RedOpType.MIN
    premul = tdist._make_nccl_premul_sum(0.5)
    assert ops.op_name(premul) == "premul_sum(0.5)"
    ops.check_op(premul, "float32")
    assert ops.op_name(make_premul_sum(torch.tensor(0.25))) == "premul_sum(0.25)"
    # own_op: torch's ops as asyncdist's, resolved once (the torch backend's calls).
    for k in RedOpType:
        if k is not RedOpType.PREMUL_SUM:
            assert own_op(tdist.ReduceOp(getattr(tdist.ReduceOp, k.name))) is k
    assert ops.op_name(own_op(premul)) == "premul_sum(0.5)"
    with pytest.raises(InvalidArgumentError, match="op must be a ReduceOp"):
        own_op(7)

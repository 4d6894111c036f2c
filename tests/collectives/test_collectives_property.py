"""Every collective x ReduceOp x dtype x world size, against NumPy.

Hypothesis draws the call (world size in {1, 2, 3, 4, 5, 8}, dtype, op,
root, element count — small ones for the latency algorithms, large ones for
the pipelined rings) and a seed for each rank's input. The expected result
is computed here with NumPy from the same inputs, independently of
asyncdist's kernels. Inputs are small integers (also for floats) so that
every reduction order gives the same exact result, which lets floats be
compared exactly too.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncdist.reduce import kernels as ops
from asyncdist.reduce.kernels import ReduceOp

try:
    import torch
except ImportError:
    torch = None

INTS = ["uint8", "int8", "int16", "int32", "int64"]
FLOATS = ["float16", "float32", "float64"]
COMPLEX = ["complex64", "complex128"]
NUMPY_DTYPES = ["bool"] + INTS + FLOATS + COMPLEX
DTYPES = NUMPY_DTYPES + (["bfloat16"] if torch is not None else [])
WORLD_SIZES = (1, 2, 3, 4, 5, 8)

OPS = {
    "sum": ReduceOp.SUM,
    "product": ReduceOp.PRODUCT,
    "min": ReduceOp.MIN,
    "max": ReduceOp.MAX,
    "band": ReduceOp.BAND,
    "bor": ReduceOp.BOR,
    "bxor": ReduceOp.BXOR,
    "avg": ReduceOp.AVG,
    "premul_sum": ops.make_premul_sum(2.0),
}


def op_is_defined(op: str, dtype: str) -> bool:
    """The documented rules, restated independently of ops.check_op."""
    if op in ("band", "bor", "bxor"):
        return dtype == "bool" or dtype in INTS
    if op in ("avg", "premul_sum"):
        return dtype in FLOATS or dtype in COMPLEX or dtype == "bfloat16"
    if op in ("min", "max"):
        return dtype not in COMPLEX
    return True


def make_input(seed: int, rank: int, shape: tuple[int, ...], dtype: str, op: str = "sum") -> np.ndarray:
    """Rank ``rank``'s input as a NumPy array (bfloat16 data kept as float32)."""
    rng = np.random.default_rng([seed, rank])
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    if op == "product":  # keep products of 8 values small and exact
        values = rng.choice(np.array([-2, -1, 1, 2]), size=shape)
    elif dtype in ("uint8",) or op in ("band", "bor", "bxor"):
        values = rng.integers(0, 8, size=shape)
    else:
        values = rng.integers(-4, 5, size=shape)
    if dtype in COMPLEX:
        return (values + 1j * rng.integers(-4, 5, size=shape)).astype(dtype)
    return values.astype("float32" if dtype == "bfloat16" else dtype)


def reference(op: str, arrays: list[np.ndarray], dtype: str) -> np.ndarray:
    result = _reduce(op, arrays, dtype)
    if dtype == "bfloat16":  # the data is carried as float32 here; round as bfloat16 would
        return torch.from_numpy(result).to(torch.bfloat16).float().numpy()
    return result


def _reduce(op: str, arrays: list[np.ndarray], dtype: str) -> np.ndarray:
    stack = np.stack(arrays)
    if dtype == "bool":
        logical = {"sum": np.any, "max": np.any, "bor": np.any, "product": np.all, "min": np.all, "band": np.all}
        if op == "bxor":
            return np.logical_xor.reduce(stack, axis=0)
        return logical[op](stack, axis=0)
    with np.errstate(over="ignore"):
        if op == "sum":
            return stack.sum(axis=0, dtype=stack.dtype)
        if op == "product":
            return stack.prod(axis=0, dtype=stack.dtype)
        if op == "min":
            return stack.min(axis=0)
        if op == "max":
            return stack.max(axis=0)
        if op == "band":
            return np.bitwise_and.reduce(stack, axis=0)
        if op == "bor":
            return np.bitwise_or.reduce(stack, axis=0)
        if op == "bxor":
            return np.bitwise_xor.reduce(stack, axis=0)
        if op == "avg":
            return (stack.astype(np.complex128 if dtype in COMPLEX else np.float64).sum(axis=0) / len(arrays)).astype(stack.dtype)
        if op == "premul_sum":
            return (2 * stack).sum(axis=0, dtype=stack.dtype)
    raise AssertionError(op)


def to_user(array: np.ndarray, dtype: str, lib: str):
    """The object a user would pass: a NumPy array or a torch tensor."""
    if dtype == "bfloat16":
        return torch.from_numpy(array.copy()).to(torch.bfloat16)
    if lib == "torch" and torch is not None:
        return torch.from_numpy(array.copy())
    return array.copy()


def from_user(obj) -> np.ndarray:
    if torch is not None and isinstance(obj, torch.Tensor):
        return (obj.float() if obj.dtype == torch.bfloat16 else obj).numpy().copy()
    return np.asarray(obj).copy()


def assert_same(got: np.ndarray, expected: np.ndarray, what: str) -> None:
    assert got.shape == expected.shape, what
    if got.dtype.kind in "fc" and expected.dtype.kind in "fc":
        np.testing.assert_allclose(got, expected, rtol=1e-2 if expected.dtype == np.float16 else 1e-6, err_msg=what)
    else:
        np.testing.assert_array_equal(got, expected.astype(got.dtype), err_msg=what)


counts = st.one_of(st.integers(0, 40), st.sampled_from([16411, 40000]))
libs = st.sampled_from(["numpy", "torch"] if torch is not None else ["numpy"])


@st.composite
def reduction_cases(draw):
    dtype = draw(st.sampled_from(DTYPES))
    op = draw(st.sampled_from([name for name in OPS if op_is_defined(name, dtype)]))
    n = draw(st.sampled_from(WORLD_SIZES))
    return n, dtype, op, draw(counts), draw(st.integers(0, 2**32 - 1)), draw(libs), draw(st.integers(0, n - 1))


@st.composite
def data_cases(draw):
    n = draw(st.sampled_from(WORLD_SIZES))
    return n, draw(st.sampled_from(DTYPES)), draw(counts), draw(st.integers(0, 2**32 - 1)), draw(libs), draw(st.integers(0, n - 1))


EXAMPLES = settings(max_examples=60, deadline=None)


@EXAMPLES
@given(reduction_cases())
def test_all_reduce(worlds, case) -> None:
    n, dtype, op, count, seed, lib, _ = case
    inputs = [make_input(seed, r, (count,), dtype, op) for r in range(n)]
    tensors = [to_user(x, dtype, lib) for x in inputs]
    worlds.run(n, lambda g: g.all_reduce(tensors[g.rank], OPS[op]))
    expected = reference(op, inputs, dtype)
    results = [from_user(t) for t in tensors]
    for rank, got in enumerate(results):
        assert_same(got, expected, f"rank {rank}")
        assert got.tobytes() == results[0].tobytes(), "ranks must agree bit for bit"


@EXAMPLES
@given(reduction_cases())
def test_reduce(worlds, case) -> None:
    n, dtype, op, count, seed, lib, root = case
    inputs = [make_input(seed, r, (count,), dtype, op) for r in range(n)]
    tensors = [to_user(x, dtype, lib) for x in inputs]
    worlds.run(n, lambda g: g.reduce(tensors[g.rank], root, OPS[op]))
    for rank, tensor in enumerate(tensors):
        expected = reference(op, inputs, dtype) if rank == root else inputs[rank]
        assert_same(from_user(tensor), expected, f"rank {rank} (root {root})")


@EXAMPLES
@given(reduction_cases(), st.booleans())
def test_reduce_scatter(worlds, case, as_one_tensor: bool) -> None:
    n, dtype, op, count, seed, lib, _ = case
    count = min(count, 2000)
    inputs = [make_input(seed, r, (n * count,), dtype, op) for r in range(n)]
    outputs = [to_user(np.zeros(count, dtype=inputs[0].dtype), dtype, lib) for _ in range(n)]

    async def call(g):
        mine = to_user(inputs[g.rank], dtype, lib)
        if as_one_tensor:
            await g.reduce_scatter_tensor(outputs[g.rank], mine, OPS[op])
        else:
            await g.reduce_scatter(outputs[g.rank], list(mine.reshape(n, count)), OPS[op])

    worlds.run(n, call)
    for rank, out in enumerate(outputs):
        expected = reference(op, [x[rank * count : (rank + 1) * count] for x in inputs], dtype)
        assert_same(from_user(out), expected, f"rank {rank}")


@EXAMPLES
@given(data_cases())
def test_broadcast(worlds, case) -> None:
    n, dtype, count, seed, lib, root = case
    inputs = [make_input(seed, r, (count,), dtype) for r in range(n)]
    tensors = [to_user(x, dtype, lib) for x in inputs]
    worlds.run(n, lambda g: g.broadcast(tensors[g.rank], root))
    for rank, tensor in enumerate(tensors):
        assert_same(from_user(tensor), inputs[root], f"rank {rank} (root {root})")


@EXAMPLES
@given(data_cases(), st.booleans())
def test_all_gather(worlds, case, into_tensor: bool) -> None:
    n, dtype, count, seed, lib, _ = case
    inputs = [make_input(seed, r, (count,), dtype) for r in range(n)]
    zeros = np.zeros(count, dtype=inputs[0].dtype)
    if into_tensor:
        outputs = [to_user(np.zeros(n * count, dtype=zeros.dtype), dtype, lib) for _ in range(n)]
        worlds.run(n, lambda g: g.all_gather_into_tensor(outputs[g.rank], to_user(inputs[g.rank], dtype, lib)))
        for rank, out in enumerate(outputs):
            assert_same(from_user(out), np.concatenate(inputs), f"rank {rank}")
    else:
        outputs = [[to_user(zeros, dtype, lib) for _ in range(n)] for _ in range(n)]
        worlds.run(n, lambda g: g.all_gather(outputs[g.rank], to_user(inputs[g.rank], dtype, lib)))
        for rank, outs in enumerate(outputs):
            for src, out in enumerate(outs):
                assert_same(from_user(out), inputs[src], f"rank {rank}, slot {src}")


@EXAMPLES
@given(data_cases())
def test_gather_and_scatter(worlds, case) -> None:
    n, dtype, count, seed, lib, root = case
    inputs = [make_input(seed, r, (count,), dtype) for r in range(n)]
    zeros = np.zeros(count, dtype=inputs[0].dtype)
    gathered = [to_user(zeros, dtype, lib) for _ in range(n)]
    worlds.run(n, lambda g: g.gather(to_user(inputs[g.rank], dtype, lib), gathered if g.rank == root else None, root))
    for src, out in enumerate(gathered):
        assert_same(from_user(out), inputs[src], f"gather slot {src} (root {root})")

    pieces = [make_input(seed + 1, r, (count,), dtype) for r in range(n)]
    received = [to_user(zeros, dtype, lib) for _ in range(n)]
    scatter_list = [to_user(p, dtype, lib) for p in pieces]
    worlds.run(n, lambda g: g.scatter(received[g.rank], scatter_list if g.rank == root else None, root))
    for rank, out in enumerate(received):
        assert_same(from_user(out), pieces[rank], f"scatter to rank {rank} (root {root})")


@EXAMPLES
@given(data_cases())
def test_all_to_all(worlds, case) -> None:
    n, dtype, count, seed, lib, _ = case
    count = min(count, 5000)
    inputs = [[make_input(seed, r * n + j, (count,), dtype) for j in range(n)] for r in range(n)]
    zeros = np.zeros(count, dtype=inputs[0][0].dtype)
    outputs = [[to_user(zeros, dtype, lib) for _ in range(n)] for _ in range(n)]
    worlds.run(n, lambda g: g.all_to_all(outputs[g.rank], [to_user(x, dtype, lib) for x in inputs[g.rank]]))
    for rank in range(n):
        for src in range(n):
            assert_same(from_user(outputs[rank][src]), inputs[src][rank], f"rank {rank} from {src}")


@EXAMPLES
@given(data_cases(), st.data())
def test_all_to_all_single_with_splits(worlds, case, data) -> None:
    n, dtype, _, seed, lib, _ = case
    width = 3
    splits = [[data.draw(st.integers(0, 4)) for _ in range(n)] for _ in range(n)]  # rows rank i sends to j
    inputs = [make_input(seed, r, (sum(splits[r]), width), dtype) for r in range(n)]
    outputs = [to_user(np.zeros((sum(splits[i][j] for i in range(n)), width), dtype=inputs[0].dtype), dtype, lib) for j in range(n)]

    async def call(g):
        r = g.rank
        await g.all_to_all_single(outputs[r], to_user(inputs[r], dtype, lib),
                                  output_split_sizes=[splits[i][r] for i in range(n)], input_split_sizes=splits[r])

    worlds.run(n, call)
    for j in range(n):
        pieces = [inputs[i][sum(splits[i][:j]) : sum(splits[i][: j + 1])] for i in range(n)]
        assert_same(from_user(outputs[j]), np.concatenate(pieces), f"rank {j}")


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_barrier_and_back_to_back_calls_on_every_size(worlds, n: int) -> None:
    def call(g):
        async def body():
            await g.barrier()
            x = np.full(5, g.rank, dtype=np.int64)
            await g.all_reduce(x)
            await g.barrier()
            return x

        return body()

    results = worlds.run(n, call)
    for x in results:
        np.testing.assert_array_equal(x, np.full(5, sum(range(n))))


@pytest.mark.parametrize(
    "op, dtype",
    [(name, dtype) for name in OPS for dtype in DTYPES if not op_is_defined(name, dtype)],
)
def test_undefined_op_and_dtype_pairs_are_refused_locally(worlds, op: str, dtype: str) -> None:
    tensor = to_user(make_input(0, 0, (3,), dtype), dtype, "numpy")
    with pytest.raises(ValueError, match=dtype):
        worlds.run(1, lambda g: g.all_reduce(tensor, OPS[op]))

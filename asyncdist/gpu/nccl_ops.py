"""Each collective and point-to-point op as NCCL calls on device pointers.

The functions here issue, they do not wait: each queues NCCL calls (and the
few kernels a reduction needs around them) on the communicator's stream and
returns. :mod:`asyncdist.gpu.nccl` orders them after the caller's stream and
observes their completion. Arrays are passed as raw pointers
(``data_ptr()`` / ``__cuda_array_interface__``): nothing is copied.

The mapping, as torch's ProcessGroupNCCL does it:

* data movement (broadcast, gathers, scatter, all_to_all, send/recv) moves
  bytes (``ncclUint8``), so every dtype travels;
* reductions use NCCL's dtype; bool reduces as uint8 (SUM and BOR as MAX,
  PRODUCT and BAND as MIN); complex as pairs of reals (SUM, AVG, PREMUL_SUM
  only); AVG is ``ncclAvg`` from NCCL 2.10, else SUM then a scale; PREMUL_SUM
  scales a copy of the input first; bitwise ops on integers and 16-bit
  integer dtypes have no NCCL form and raise InvalidArgumentError;
* list-shaped collectives are *group calls* (``groupStart``/``groupEnd``):
  all_gather into a list is n broadcasts, reduce_scatter from a list n
  reduces, gather/scatter/all_to_all sends and receives (to self too).

Sizes and dtypes are checked locally; NCCL cannot check that ranks agree, so
a call whose ranks disagree is the caller's bug, as with torch's NCCL backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..buffers.host import describe
from ..errors import InvalidArgumentError
from ..reduce.op import RedOpType, _resolve, check_op
from .device import DeviceAdapter

__all__ = ["Issue", "ISSUERS", "NCCL_DTYPES"]

NCCL_UINT8 = 1
#: Canonical dtype -> ncclDataType_t (NCCL's ABI values), and the NCCL version each needs.
NCCL_DTYPES = {
    "int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5,
    "float16": 6, "float32": 7, "float64": 8, "bfloat16": 9, "float8_e4m3fn": 10, "float8_e5m2": 11,
}  # fmt: skip
_SINCE = {"bfloat16": 21000, "float8_e4m3fn": 21900, "float8_e5m2": 21900}
_SUM, _PROD, _MAX, _MIN, _AVG = 0, 1, 2, 3, 4
_OPS = {RedOpType.SUM: _SUM, RedOpType.PRODUCT: _PROD, RedOpType.MAX: _MAX, RedOpType.MIN: _MIN}
_BOOL_OPS = {**_OPS, RedOpType.SUM: _MAX, RedOpType.PRODUCT: _MIN, RedOpType.BOR: _MAX, RedOpType.BAND: _MIN}
_COMPLEX_PARTS = {"complex64": "float32", "complex128": "float64"}


@dataclass(slots=True)
class Issue:
    """What an issuer needs: the communicator, its stream, and where to keep temporaries."""

    comm: Any
    nccl: Any
    adapter: DeviceAdapter
    stream: Any
    rank: int
    size: int
    version: int
    keep: list = field(default_factory=list)  # temporaries alive until the op completes

    @property
    def handle(self) -> int:
        return self.adapter.stream_handle(self.stream)

    def ptr(self, array: Any, byte_offset: int = 0) -> int:
        return self.adapter.data_ptr(array) + byte_offset

    def nbytes(self, array: Any) -> int:
        return self.adapter.nbytes(array)

    def layout(self, array: Any) -> tuple[str, int]:
        """(dtype, element count) of ``array``."""
        adapter = self.adapter
        shape = adapter.shape(array)
        count = 1
        for d in shape:
            count *= d
        return adapter.dtype_name(array), count

    def group(self) -> Any:
        """``with issue.group():`` brackets NCCL calls in groupStart/groupEnd."""
        return _Group(self.nccl)


class _Group:
    def __init__(self, nccl: Any) -> None:
        self._nccl = nccl

    def __enter__(self) -> None:
        self._nccl.groupStart()

    def __exit__(self, *exc: object) -> None:
        self._nccl.groupEnd()


@dataclass(slots=True, frozen=True)
class _Reduction:
    dtype: int
    op: int
    parts: int  # NCCL elements per element (2 for complex)
    pre: Any  # PREMUL_SUM factor, or None
    post: float | None  # scale after a SUM standing in for AVG


def _reduction(x: Issue, op: Any, dtype: str) -> _Reduction:
    check_op(op, dtype)  # asyncdist's own rules first: the same errors as on the host
    kind, factor = _resolve(op)
    base = _COMPLEX_PARTS.get(dtype, dtype)
    where = f"ReduceOp.{kind.name} on {dtype} with NCCL"
    if dtype in _COMPLEX_PARTS and kind not in (RedOpType.SUM, RedOpType.AVG, RedOpType.PREMUL_SUM):
        raise InvalidArgumentError(f"{where}: NCCL reduces complex numbers with SUM, AVG and PREMUL_SUM only")
    code = NCCL_DTYPES.get("uint8" if base == "bool" else base)
    if code is None or x.version < _SINCE.get(base, 0):
        raise InvalidArgumentError(f"{where}: NCCL {x.version} has no reduction for {dtype}")
    parts = 2 if dtype in _COMPLEX_PARTS else 1
    if kind is RedOpType.AVG:
        if x.version >= 21000:
            return _Reduction(code, _AVG, parts, None, None)
        return _Reduction(code, _SUM, parts, None, 1.0 / x.size)
    if kind is RedOpType.PREMUL_SUM:
        return _Reduction(code, _SUM, parts, factor, None)
    nccl_op = (_BOOL_OPS if dtype == "bool" else _OPS).get(kind)
    if nccl_op is None:
        raise InvalidArgumentError(f"{where}: NCCL has no bitwise reductions (use the staging path: backend 'cpu:gloo,cuda:gloo')")
    return _Reduction(code, nccl_op, parts, None, None)


def _send_buffer(x: Issue, r: _Reduction, array: Any) -> Any:
    if r.pre is None:
        return array
    scaled = x.adapter.scaled_copy(array, r.pre, x.stream)
    x.keep.append(scaled)
    return scaled


def _check_list(x: Issue, arrays: Any, like: Any, what: str, *, same_size: bool = True) -> list:
    if not isinstance(arrays, (list, tuple)) or len(arrays) != x.size:
        got = len(arrays) if isinstance(arrays, (list, tuple)) else type(arrays).__name__
        raise InvalidArgumentError(f"{what} must be a list of {x.size} tensors (one per rank), got {got}")
    dtype, count = x.layout(like)
    for i, a in enumerate(arrays):
        d, c = x.layout(a)
        if d != dtype or (same_size and c != count):
            raise InvalidArgumentError(f"{what}[{i}] is {describe(d, (c,))}, expected {describe(dtype, (count,))}")
    return list(arrays)


def _root(x: Issue, root: Any, what: str) -> int:
    if type(root) is not int or not 0 <= root < x.size:
        raise InvalidArgumentError(f"invalid {what} {root!r} for a group of size {x.size}")
    return root


# -- the ops ---------------------------------------------------------------------


def all_reduce(x: Issue, tensor: Any, op: Any) -> None:
    dtype, count = x.layout(tensor)
    r = _reduction(x, op, dtype)
    x.comm.allReduce(x.ptr(_send_buffer(x, r, tensor)), x.ptr(tensor), count * r.parts, r.dtype, r.op, x.handle)
    if r.post is not None:
        x.adapter.scale_(tensor, r.post, x.stream)


def all_reduce_coalesced(x: Issue, tensors: Sequence[Any], op: Any) -> None:
    plans = [(t, _reduction(x, op, x.layout(t)[0])) for t in tensors]
    sends = [_send_buffer(x, r, t) for t, r in plans]  # scaling kernels before the group
    with x.group():
        for (t, r), s in zip(plans, sends):
            x.comm.allReduce(x.ptr(s), x.ptr(t), x.layout(t)[1] * r.parts, r.dtype, r.op, x.handle)
    for t, r in plans:
        if r.post is not None:
            x.adapter.scale_(t, r.post, x.stream)


def broadcast(x: Issue, tensor: Any, src: int) -> None:
    root = _root(x, src, "src")
    x.comm.broadcast(x.ptr(tensor), x.ptr(tensor), x.nbytes(tensor), NCCL_UINT8, root, x.handle)


def reduce(x: Issue, tensor: Any, dst: int, op: Any) -> None:
    root = _root(x, dst, "dst")
    dtype, count = x.layout(tensor)
    r = _reduction(x, op, dtype)
    # recvbuff matters on the root only; elsewhere the input is left as it was.
    x.comm.reduce(x.ptr(_send_buffer(x, r, tensor)), x.ptr(tensor), count * r.parts, r.dtype, r.op, root, x.handle)
    if r.post is not None and x.rank == root:
        x.adapter.scale_(tensor, r.post, x.stream)


def all_gather(x: Issue, tensor_list: Sequence[Any], tensor: Any) -> None:
    outputs = _check_list(x, tensor_list, tensor, "tensor_list")
    n = x.nbytes(tensor)
    with x.group():  # one broadcast per rank, straight into each output
        for r, out in enumerate(outputs):
            x.comm.broadcast(x.ptr(tensor if r == x.rank else out), x.ptr(out), n, NCCL_UINT8, r, x.handle)


def all_gather_into_tensor(x: Issue, output_tensor: Any, input_tensor: Any) -> None:
    _check_gather(x, output_tensor, input_tensor, "output_tensor", "all_gather_into_tensor")
    x.comm.allGather(x.ptr(input_tensor), x.ptr(output_tensor), x.nbytes(input_tensor), NCCL_UINT8, x.handle)


def all_gather_into_tensor_coalesced(x: Issue, outputs: Sequence[Any], inputs: Sequence[Any]) -> None:
    pairs = _pairs(outputs, inputs, "all_gather_into_tensor_coalesced")
    for i, (out, inp) in enumerate(pairs):
        _check_gather(x, out, inp, f"outputs[{i}]", "all_gather_into_tensor_coalesced")
    with x.group():
        for out, inp in pairs:
            x.comm.allGather(x.ptr(inp), x.ptr(out), x.nbytes(inp), NCCL_UINT8, x.handle)


def _check_gather(x: Issue, output: Any, input: Any, name: str, what: str) -> None:
    (d_out, c_out), (d_in, c_in) = x.layout(output), x.layout(input)
    if d_out != d_in or c_out != c_in * x.size:
        raise InvalidArgumentError(f"{name} is {describe(d_out, (c_out,))}; {what} needs {x.size} x {describe(d_in, (c_in,))}")


def _pairs(outputs: Sequence[Any], inputs: Sequence[Any], what: str) -> list[tuple[Any, Any]]:
    if len(outputs) != len(inputs):
        raise InvalidArgumentError(f"{what}: {len(outputs)} outputs and {len(inputs)} inputs; they go in pairs")
    return list(zip(outputs, inputs))


def gather(x: Issue, tensor: Any, gather_list: Sequence[Any] | None, dst: int) -> None:
    root = _root(x, dst, "dst")
    n = x.nbytes(tensor)
    if x.rank != root:
        if gather_list:
            raise InvalidArgumentError(f"gather_list must be None or empty on ranks other than dst={root}")
        x.comm.send(x.ptr(tensor), n, NCCL_UINT8, root, x.handle)
        return
    outputs = _check_list(x, gather_list, tensor, "gather_list")
    with x.group():
        x.comm.send(x.ptr(tensor), n, NCCL_UINT8, root, x.handle)  # to self
        for r, out in enumerate(outputs):
            x.comm.recv(x.ptr(out), n, NCCL_UINT8, r, x.handle)


def scatter(x: Issue, tensor: Any, scatter_list: Sequence[Any] | None, src: int) -> None:
    root = _root(x, src, "src")
    n = x.nbytes(tensor)
    if x.rank != root:
        if scatter_list:
            raise InvalidArgumentError(f"scatter_list must be None or empty on ranks other than src={root}")
        x.comm.recv(x.ptr(tensor), n, NCCL_UINT8, root, x.handle)
        return
    inputs = _check_list(x, scatter_list, tensor, "scatter_list")
    with x.group():
        for r, inp in enumerate(inputs):
            x.comm.send(x.ptr(inp), n, NCCL_UINT8, r, x.handle)
        x.comm.recv(x.ptr(tensor), n, NCCL_UINT8, root, x.handle)  # from self


def reduce_scatter(x: Issue, output: Any, input_list: Sequence[Any], op: Any) -> None:
    inputs = _check_list(x, input_list, output, "input")
    dtype, count = x.layout(output)
    r = _reduction(x, op, dtype)
    sends = [_send_buffer(x, r, t) for t in inputs]
    with x.group():  # rank i's output is the reduce of everyone's input_list[i], rooted at i
        for i, s in enumerate(sends):
            recv = output if i == x.rank else s
            x.comm.reduce(x.ptr(s), x.ptr(recv), count * r.parts, r.dtype, r.op, i, x.handle)
    if r.post is not None:
        x.adapter.scale_(output, r.post, x.stream)


def reduce_scatter_tensor(x: Issue, output: Any, input: Any, op: Any) -> None:
    r = _scatter_reduction(x, output, input, op, "input", "reduce_scatter_tensor")
    x.comm.reduceScatter(x.ptr(_send_buffer(x, r, input)), x.ptr(output), x.layout(output)[1] * r.parts, r.dtype,
                         r.op, x.handle)
    if r.post is not None:
        x.adapter.scale_(output, r.post, x.stream)


def reduce_scatter_tensor_coalesced(x: Issue, outputs: Sequence[Any], inputs: Sequence[Any], op: Any) -> None:
    pairs = _pairs(outputs, inputs, "reduce_scatter_tensor_coalesced")
    plans = [(out, inp, _scatter_reduction(x, out, inp, op, f"inputs[{i}]", "reduce_scatter_tensor_coalesced"))
             for i, (out, inp) in enumerate(pairs)]
    sends = [_send_buffer(x, r, inp) for _, inp, r in plans]  # scaling kernels before the group
    with x.group():
        for (out, _, r), send in zip(plans, sends):
            x.comm.reduceScatter(x.ptr(send), x.ptr(out), x.layout(out)[1] * r.parts, r.dtype, r.op, x.handle)
    for out, _, r in plans:
        if r.post is not None:
            x.adapter.scale_(out, r.post, x.stream)


def _scatter_reduction(x: Issue, output: Any, input: Any, op: Any, name: str, what: str) -> Any:
    """The reduction of a reduce-scatter of ``input`` into ``output``, once their layouts are checked
    (InvalidArgumentError naming ``name`` if they do not fit)."""
    (d_out, c_out), (d_in, c_in) = x.layout(output), x.layout(input)
    if d_out != d_in or c_in != c_out * x.size:
        raise InvalidArgumentError(f"{name} is {describe(d_in, (c_in,))}; {what} needs {x.size} x {describe(d_out, (c_out,))}")
    return _reduction(x, op, d_out)


def all_to_all(x: Issue, output_tensor_list: Sequence[Any], input_tensor_list: Sequence[Any]) -> None:
    outputs = _check_list(x, output_tensor_list, output_tensor_list[0] if output_tensor_list else None, "output_tensor_list", same_size=False)
    inputs = _check_list(x, input_tensor_list, outputs[0], "input_tensor_list", same_size=False)
    with x.group():
        for r in range(x.size):
            x.comm.send(x.ptr(inputs[r]), x.nbytes(inputs[r]), NCCL_UINT8, r, x.handle)
            x.comm.recv(x.ptr(outputs[r]), x.nbytes(outputs[r]), NCCL_UINT8, r, x.handle)


def all_to_all_single(
    x: Issue, output: Any, input: Any, output_split_sizes: Sequence[int] | None, input_split_sizes: Sequence[int] | None
) -> None:
    if x.adapter.dtype_name(output) != x.adapter.dtype_name(input):
        raise InvalidArgumentError(
            f"all_to_all_single: output is {x.adapter.dtype_name(output)}, input is {x.adapter.dtype_name(input)}"
        )
    sends = _row_slices(x, input, input_split_sizes, "input")
    receives = _row_slices(x, output, output_split_sizes, "output")
    with x.group():
        for r in range(x.size):
            x.comm.send(x.ptr(input, sends[r][0]), sends[r][1], NCCL_UINT8, r, x.handle)
            x.comm.recv(x.ptr(output, receives[r][0]), receives[r][1], NCCL_UINT8, r, x.handle)


def _row_slices(x: Issue, array: Any, sizes: Sequence[int] | None, what: str) -> list[tuple[int, int]]:
    """(byte offset, bytes) of each rank's rows of ``array`` along dim 0."""
    shape = x.adapter.shape(array)
    rows = shape[0] if shape else 1
    row_bytes = x.nbytes(array) // rows if rows else 0
    if sizes is None or len(sizes) == 0:
        if rows % x.size:
            raise InvalidArgumentError(f"{what} has {rows} rows, which do not split evenly over {x.size} ranks")
        sizes = [rows // x.size] * x.size
    if len(sizes) != x.size or any(type(s) is not int or s < 0 for s in sizes) or sum(sizes) != rows:
        raise InvalidArgumentError(f"{what}_split_sizes {list(sizes)} must be {x.size} non-negative ints summing to {rows} rows")
    out, start = [], 0
    for s in sizes:
        out.append((start * row_bytes, s * row_bytes))
        start += s
    return out


def send(x: Issue, tensor: Any, peer: int) -> None:
    x.comm.send(x.ptr(tensor), x.nbytes(tensor), NCCL_UINT8, peer, x.handle)


def recv(x: Issue, tensor: Any, peer: int) -> None:
    x.comm.recv(x.ptr(tensor), x.nbytes(tensor), NCCL_UINT8, peer, x.handle)


ISSUERS: dict[str, Callable[..., None]] = {
    f.__name__: f
    for f in (
        all_reduce, all_reduce_coalesced, broadcast, reduce, all_gather, all_gather_into_tensor,
        all_gather_into_tensor_coalesced, gather, scatter, reduce_scatter, reduce_scatter_tensor,
        reduce_scatter_tensor_coalesced, all_to_all, all_to_all_single, send, recv,
    )
}  # fmt: skip
"""Op name -> its issuer, called as ``issuer(issue, **arguments)``."""

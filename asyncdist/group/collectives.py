"""The collectives of a group (await API): arguments checked, algorithm chosen, call run.

Each method checks its arguments locally (so a bad call fails at once with
a clear error rather than as a mismatch on another rank), turns tensors
into host buffers, describes the call for the mismatch check
("all_reduce(sum, float32[1024])"), opens the group's next channel and
runs the algorithm that :mod:`asyncdist.collectives.select` picks.

Ranks are group ranks. Semantics are torch.distributed's: in place where
torch is in place, inputs left untouched where torch leaves them.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..reduce import kernels as ops
from ..buffers.host import HostBuffer, as_host_buffer, describe as describe_buffer, scratch_buffer
from ..collectives import select
from ..collectives.barrier import dissemination_barrier
from ..collectives.direct import copy_into, direct_all_to_all, direct_gather, direct_scatter
from ..collectives.ring import even_slots, ring_all_gather, ring_reduce_scatter
from ..errors import InvalidArgumentError
from ..flight.descriptions import describe
from ..reduce.op import ReduceOp
from ..buffers.contiguous import NO_WRITE_BACK, Writeback, staged
from ..engine.channel import Channel
from .calls import Calls
from .packing import by_dtype, describe_packed, offsets, pack, unpack

__all__ = ["Collectives"]


def _same_layout(buffers: Sequence[HostBuffer], like: HostBuffer, what: str) -> None:
    for i, buf in enumerate(buffers):
        if buf.dtype != like.dtype or buf.numel != like.numel:
            raise InvalidArgumentError(
                f"{what}[{i}] is {describe_buffer(buf.dtype, buf.shape)}, expected {describe_buffer(like.dtype, like.shape)}"
            )


def _write_back(writebacks: Sequence[Writeback]) -> None:
    for write_back in writebacks:
        write_back()


class Collectives:
    """The host collectives of one group; ProcessGroup's collective methods.

    Args:
        calls: the group's numbering and timeouts; every method opens the
            group's next call through it.
    """

    def __init__(self, calls: Calls) -> None:
        self._calls = calls
        self._members = calls.members
        self.rank = calls.members.rank
        self.size = calls.members.size

    def _root(self, root: object, what: str) -> int:
        return self._members.check(root, what)

    def _list(self, tensors: Any, what: str) -> list:
        if not isinstance(tensors, (list, tuple)) or len(tensors) != self.size:
            got = len(tensors) if isinstance(tensors, (list, tuple)) else type(tensors).__name__
            raise InvalidArgumentError(f"{what} must be a list of {self.size} tensors (one per rank), got {got}")
        return list(tensors)

    async def barrier(self) -> None:
        """Return once every member has entered the barrier."""
        channel = self._calls.channel(describe("barrier"))
        await channel.run(dissemination_barrier(channel))

    async def broadcast(self, tensor: Any, src: int) -> None:
        """Copy group rank ``src``'s ``tensor`` into every rank's ``tensor``."""
        root = self._root(src, "src")
        buf, write_back = staged(tensor, writable=True)
        channel = self._calls.channel(describe("broadcast", root=root, dtype=buf.dtype, shape=buf.shape), root)
        await channel.run(select.broadcast(channel, buf, root))
        write_back()

    async def all_reduce_coalesced(self, tensors: Sequence[Any], op: Any = ReduceOp.SUM) -> None:
        """All-reduce several tensors, each in place, as one call per dtype (:mod:`.packing`).

        Every tensor is checked, then every call numbered, before the first
        one runs: a bad tensor fails the whole request at once, and a
        collective started concurrently on this group cannot slip in between.
        """
        checked = [staged(tensor, writable=True) for tensor in tensors]
        bufs = [buf for buf, _ in checked]
        groups = by_dtype(bufs)
        names = [ops.check_op(op, bufs[group[0]].dtype) for group in groups]
        channels = [self._calls.channel(describe_packed("all_reduce_coalesced", bufs[group[0]].dtype,
                                                        [bufs[i].numel for i in group], reduce=name))
                    for group, name in zip(groups, names)]  # fmt: skip
        for channel, group in zip(channels, groups):
            pieces = [bufs[i] for i in group]
            if len(pieces) == 1:  # alone of its dtype: reduced where it is, no copies
                await self._reduce_all(channel, pieces[0], NO_WRITE_BACK, op)
                continue
            starts = offsets([piece.numel for piece in pieces])
            packed = scratch_buffer(pieces[0].dtype, starts[-1])
            pack(packed, pieces, starts)
            await self._reduce_all(channel, packed, NO_WRITE_BACK, op)
            unpack(packed, pieces, starts)
        _write_back([write_back for _, write_back in checked])

    async def all_reduce(self, tensor: Any, op: Any = ReduceOp.SUM) -> None:
        """Combine every rank's ``tensor`` with ``op``; every rank gets the result in place."""
        buf, write_back = staged(tensor, writable=True)
        name = ops.check_op(op, buf.dtype)
        channel = self._calls.channel(describe("all_reduce", reduce=name, dtype=buf.dtype, shape=buf.shape))
        await self._reduce_all(channel, buf, write_back, op)

    async def _reduce_all(self, channel: Channel, buf: HostBuffer, write_back: Writeback, op: Any) -> None:
        ops.prepare(op, buf)
        await channel.run(select.all_reduce(channel, buf, op))
        ops.finish(op, buf, self.size)
        write_back()

    async def reduce(self, tensor: Any, dst: int, op: Any = ReduceOp.SUM) -> None:
        """Combine every rank's ``tensor`` into group rank ``dst``'s (others are left unchanged)."""
        root = self._root(dst, "dst")
        buf, write_back = staged(tensor, writable=(self.rank == root))
        name = ops.check_op(op, buf.dtype)
        described = describe("reduce", root=root, reduce=name, dtype=buf.dtype, shape=buf.shape)
        channel = self._calls.channel(described, root)
        if self.rank != root:
            accumulator = scratch_buffer(buf.dtype, buf.numel)
            copy_into(accumulator, buf)
            buf = accumulator
        ops.prepare(op, buf)
        await channel.run(select.reduce(channel, buf, root, op))
        if self.rank == root:
            ops.finish(op, buf, self.size)
            write_back()

    async def all_gather(self, tensor_list: Sequence[Any], tensor: Any) -> None:
        """Every rank's ``tensor`` lands in every rank's ``tensor_list[rank]``."""
        outputs = self._list(tensor_list, "tensor_list")
        send, _ = staged(tensor, writable=False)
        staged_outputs = [staged(t, writable=True, name="tensor_list[i]") for t in outputs]
        slots = [buf for buf, _ in staged_outputs]
        _same_layout(slots, send, "tensor_list")
        channel = self._calls.channel(describe("all_gather", dtype=send.dtype, shape=send.shape))
        copy_into(slots[self.rank], send)
        await channel.run(ring_all_gather(channel, slots))
        _write_back([write_back for _, write_back in staged_outputs])

    async def all_gather_into_tensor(self, output_tensor: Any, input_tensor: Any) -> None:
        """Concatenate every rank's ``input_tensor`` (in rank order) into ``output_tensor``."""
        send, _ = staged(input_tensor, writable=False, name="input_tensor")
        out, write_back = staged(output_tensor, writable=True, name="output_tensor")
        if out.dtype != send.dtype or out.numel != send.numel * self.size:
            raise InvalidArgumentError(
                f"output_tensor is {describe_buffer(out.dtype, out.shape)}; all_gather_into_tensor needs "
                f"{self.size} x {describe_buffer(send.dtype, send.shape)}"
            )
        channel = self._calls.channel(describe("all_gather_into_tensor", dtype=send.dtype, shape=send.shape))
        slots = even_slots(out, self.size)
        copy_into(slots[self.rank], send)
        await channel.run(ring_all_gather(channel, slots))
        write_back()

    async def all_gather_into_tensor_coalesced(self, outputs: Sequence[Any], inputs: Sequence[Any]) -> None:
        """:meth:`all_gather_into_tensor` of each ``inputs[i]`` into ``outputs[i]``, as one
        call per dtype (:mod:`.packing`); checked and numbered as :meth:`all_reduce_coalesced`."""
        sends = [staged(t, writable=False, name="inputs[i]")[0] for t in inputs]
        received = [staged(t, writable=True, name="outputs[i]") for t in outputs]
        outs = [buf for buf, _ in received]
        self._pairs(outs, sends, "all_gather_into_tensor_coalesced")
        groups = by_dtype(sends)
        channels = [self._calls.channel(describe_packed("all_gather_into_tensor_coalesced", sends[group[0]].dtype,
                                                        [sends[i].numel for i in group]))
                    for group in groups]  # fmt: skip
        for channel, group in zip(channels, groups):
            pieces = [sends[i] for i in group]
            starts = offsets([piece.numel for piece in pieces])
            slots = even_slots(scratch_buffer(pieces[0].dtype, starts[-1] * self.size), self.size)
            pack(slots[self.rank], pieces, starts)
            await channel.run(ring_all_gather(channel, slots))
            for rank, slot in enumerate(slots):  # rank r's part of each output, from its slot
                unpack(slot, [outs[i].elements(rank * sends[i].numel, (rank + 1) * sends[i].numel) for i in group],
                       starts)
        _write_back([write_back for _, write_back in received])

    async def reduce_scatter_tensor_coalesced(self, outputs: Sequence[Any], inputs: Sequence[Any],
                                              op: Any = ReduceOp.SUM) -> None:
        """:meth:`reduce_scatter_tensor` of each ``inputs[i]`` into ``outputs[i]``, as one
        call per dtype (:mod:`.packing`); checked and numbered as :meth:`all_reduce_coalesced`."""
        received = [staged(t, writable=True, name="outputs[i]") for t in outputs]
        outs = [buf for buf, _ in received]
        wholes = [staged(t, writable=False, name="inputs[i]")[0] for t in inputs]
        self._pairs(wholes, outs, "reduce_scatter_tensor_coalesced")
        groups = by_dtype(outs)
        names = [ops.check_op(op, outs[group[0]].dtype) for group in groups]
        channels = [self._calls.channel(describe_packed("reduce_scatter_tensor_coalesced", outs[group[0]].dtype,
                                                        [outs[i].numel for i in group], reduce=name, per_rank=True))
                    for group, name in zip(groups, names)]  # fmt: skip
        for channel, group in zip(channels, groups):
            pieces = [outs[i] for i in group]
            starts = offsets([piece.numel for piece in pieces])
            accumulator = scratch_buffer(pieces[0].dtype, starts[-1] * self.size)
            slots = even_slots(accumulator, self.size)
            for rank, slot in enumerate(slots):  # slot r: the r-th part of every input, end to end
                pack(slot, [wholes[i].elements(rank * outs[i].numel, (rank + 1) * outs[i].numel) for i in group],
                     starts)
            unpack(await self._reduce_scatter_slots(channel, accumulator, slots, op), pieces, starts)
        _write_back([write_back for _, write_back in received])

    def _pairs(self, large: Sequence[HostBuffer], small: Sequence[HostBuffer], what: str) -> None:
        """Each ``large[i]`` holds ``size`` times ``small[i]``, of its dtype (a coalesced call's pairs)."""
        if len(large) != len(small):
            raise InvalidArgumentError(f"{what}: {len(large)} and {len(small)} tensors; they go in pairs")
        for i, (whole, part) in enumerate(zip(large, small)):
            if whole.dtype != part.dtype or whole.numel != part.numel * self.size:
                raise InvalidArgumentError(
                    f"{what}: tensor {i} is {describe_buffer(whole.dtype, whole.shape)}, which must be "
                    f"{self.size} x {describe_buffer(part.dtype, part.shape)}"
                )

    async def gather(self, tensor: Any, gather_list: Sequence[Any] | None = None, dst: int = 0) -> None:
        """Every rank's ``tensor`` lands in ``gather_list[rank]`` on group rank ``dst``."""
        root = self._root(dst, "dst")
        send, _ = staged(tensor, writable=False)
        slots, writebacks = None, []
        if self.rank == root:
            staged_outputs = [staged(t, writable=True, name="gather_list[i]") for t in self._list(gather_list, "gather_list")]
            slots = [buf for buf, _ in staged_outputs]
            writebacks = [write_back for _, write_back in staged_outputs]
            _same_layout(slots, send, "gather_list")
        elif gather_list:
            raise InvalidArgumentError(f"gather_list must be None or empty on ranks other than dst={root}")
        channel = self._calls.channel(describe("gather", root=root, dtype=send.dtype, shape=send.shape), root)
        await channel.run(direct_gather(channel, send, slots, root))
        _write_back(writebacks)

    async def scatter(self, tensor: Any, scatter_list: Sequence[Any] | None = None, src: int = 0) -> None:
        """Group rank ``src``'s ``scatter_list[rank]`` lands in every rank's ``tensor``."""
        root = self._root(src, "src")
        out, write_back = staged(tensor, writable=True)
        slots = None
        if self.rank == root:
            slots = [staged(t, writable=False, name="scatter_list[i]")[0] for t in self._list(scatter_list, "scatter_list")]
            _same_layout(slots, out, "scatter_list")
        elif scatter_list:
            raise InvalidArgumentError(f"scatter_list must be None or empty on ranks other than src={root}")
        channel = self._calls.channel(describe("scatter", root=root, dtype=out.dtype, shape=out.shape), root)
        await channel.run(direct_scatter(channel, slots, out, root))
        write_back()

    async def _reduce_scatter(self, out: HostBuffer, inputs: list[HostBuffer], op: Any, name: str) -> None:
        op_name = ops.check_op(op, out.dtype)
        _same_layout(inputs, out, "input")
        described = describe(name, reduce=op_name, dtype=out.dtype, shape=out.shape, per_rank=True)
        channel = self._calls.channel(described)
        accumulator = scratch_buffer(out.dtype, out.numel * self.size)
        slots = even_slots(accumulator, self.size)
        for slot, buf in zip(slots, inputs):
            copy_into(slot, buf)
        copy_into(out, await self._reduce_scatter_slots(channel, accumulator, slots, op))

    async def _reduce_scatter_slots(self, channel: Channel, accumulator: HostBuffer, slots: list[HostBuffer],
                                    op: Any) -> HostBuffer:
        """Reduce every rank's ``slots`` (over ``accumulator``); return this rank's, reduced."""
        ops.prepare(op, accumulator)
        await channel.run(ring_reduce_scatter(channel, slots, op))
        ops.finish(op, slots[self.rank], self.size)
        return slots[self.rank]

    async def reduce_scatter(self, output: Any, input_list: Sequence[Any], op: Any = ReduceOp.SUM) -> None:
        """Combine every rank's ``input_list[i]`` with ``op`` into rank i's ``output``."""
        out, write_back = staged(output, writable=True, name="output")
        inputs = [staged(t, writable=False, name="input_list[i]")[0] for t in self._list(input_list, "input_list")]
        await self._reduce_scatter(out, inputs, op, "reduce_scatter")
        write_back()

    async def reduce_scatter_tensor(self, output: Any, input: Any, op: Any = ReduceOp.SUM) -> None:
        """Combine every rank's ``input`` with ``op``; rank i gets the i-th slice in ``output``."""
        out, write_back = staged(output, writable=True, name="output")
        whole, _ = staged(input, writable=False, name="input")
        if whole.dtype != out.dtype or whole.numel != out.numel * self.size:
            raise InvalidArgumentError(
                f"input is {describe_buffer(whole.dtype, whole.shape)}; reduce_scatter_tensor needs "
                f"{self.size} x {describe_buffer(out.dtype, out.shape)}"
            )
        await self._reduce_scatter(out, even_slots(whole, self.size), op, "reduce_scatter_tensor")
        write_back()

    async def all_to_all(self, output_tensor_list: Sequence[Any], input_tensor_list: Sequence[Any]) -> None:
        """Rank i's ``input_tensor_list[j]`` lands in rank j's ``output_tensor_list[i]``."""
        outputs = [staged(t, writable=True, name="output_tensor_list[i]") for t in self._list(output_tensor_list, "output_tensor_list")]
        inputs = [staged(t, writable=False, name="input_tensor_list[i]")[0] for t in self._list(input_tensor_list, "input_tensor_list")]
        dtypes = {buf.dtype for buf, _ in outputs} | {buf.dtype for buf in inputs}
        if len(dtypes) != 1:
            raise InvalidArgumentError(f"all_to_all needs one dtype for every tensor, got {sorted(dtypes)}")
        channel = self._calls.channel(describe("all_to_all", dtype=dtypes.pop()))
        await channel.run(direct_all_to_all(channel, inputs, [buf for buf, _ in outputs]))
        _write_back([write_back for _, write_back in outputs])

    async def all_to_all_single(
        self,
        output: Any,
        input: Any,
        output_split_sizes: Sequence[int] | None = None,
        input_split_sizes: Sequence[int] | None = None,
    ) -> None:
        """Split ``input`` along dim 0 and send part j to rank j; rank i's part lands
        in ``output`` at slot i. Split sizes count dim-0 rows; None splits evenly."""
        # Unlike the other collectives, torch refuses non-contiguous tensors here.
        out = as_host_buffer(output, writable=True, name="output")
        whole = as_host_buffer(input, name="input")
        if out.dtype != whole.dtype:
            raise InvalidArgumentError(f"all_to_all_single: output is {out.dtype}, input is {whole.dtype}")
        sends = self._split_rows(whole, input_split_sizes, "input")
        receives = self._split_rows(out, output_split_sizes, "output")
        channel = self._calls.channel(describe("all_to_all_single", dtype=whole.dtype))
        await channel.run(direct_all_to_all(channel, sends, receives))

    def _split_rows(self, buf: HostBuffer, sizes: Sequence[int] | None, what: str) -> list[HostBuffer]:
        rows = buf.shape[0] if buf.shape else 1
        row = buf.numel // rows if rows else 0
        if sizes is None or len(sizes) == 0:
            if rows % self.size:
                raise InvalidArgumentError(f"{what} has {rows} rows, which do not split evenly over {self.size} ranks")
            sizes = [rows // self.size] * self.size
        if len(sizes) != self.size or any(type(s) is not int or s < 0 for s in sizes) or sum(sizes) != rows:
            raise InvalidArgumentError(
                f"{what}_split_sizes {list(sizes)} must be {self.size} non-negative ints summing to {rows} rows"
            )
        slots, start = [], 0
        for size in sizes:
            slots.append(buf.elements(start * row, (start + size) * row))
            start += size
        return slots

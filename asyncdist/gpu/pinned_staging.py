"""Pinned staging: device arrays through pooled host stand-ins.

The collective algorithms and the engine see host buffers only. A device
operand becomes a *stand-in*: a host array of the same dtype and shape over
a pinned block from :mod:`asyncdist.gpu.pinned_pool`. The host operation
then runs unchanged on the stand-ins, between two sets of asynchronous
copies:

1. **Order after the caller.** An event is recorded on the caller's current
   stream (:func:`~asyncdist.gpu.callers.caller_stream`) and the two side
   streams of the device, one for device-to-host copies and one for
   host-to-device copies, wait for it. Nothing is copied before the work
   the caller had queued, and the host never blocks.
2. **Copy in** what the operation reads on this rank (see
   :mod:`asyncdist.gpu.operands`) on the d2h stream; the loop polls the
   copies' events (:mod:`asyncdist.gpu.poll`).
3. **Run** the host operation on the stand-ins.
4. **Copy back** what it wrote on the h2d stream, record a *done* event,
   make the caller's stream wait for it, and note it for ``Work.wait()``
   (:func:`~asyncdist.gpu.callers.note_result`). The operation completes
   on the host without waiting for the copies back, as torch's gloo does.
5. **Release** each pinned block with the event after which the device no
   longer uses it; the pool hands it out again only then.

**Pipelining.** A large all_reduce, broadcast or reduce of one device tensor
(at least two :data:`PIPELINE_CHUNK_BYTES` chunks) runs as one host call per
chunk: every chunk's copy in is queued at once, chunk i's call starts when
its copy is done, and its copy back is queued as soon as the call ends, so
the copies of other chunks overlap chunk i's network transfer. Every rank
must pass a device tensor of the same size for such a call, since the
number of calls follows from it (a rank that does not fails with
CollectiveMismatchError, never with wrong data).

**Call numbers.** The host operation numbers its collective calls when it
starts, after the copies in; :meth:`ProcessGroup.reserve_calls
<asyncdist.group.process_group.ProcessGroup.reserve_calls>` takes the numbers at
the operation's first step instead, so calls are numbered in the order the
program made them, on every rank, however long each copy takes.

Loop thread only.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Hashable

from ..buffers.host import ITEMSIZES, signature
from ..errors import AsyncDistError, DeviceError, UnsupportedBufferError
from .callers import Completion, caller_stream, note_result
from .device import DeviceAdapter, adapter_for
from .operands import PIPELINED, Spec
from .pinned_pool import pool_for
from .poll import wait_events
from .seams import CallNumbers, DeviceWait, StagingGroup

__all__ = ["PIPELINE_CHUNK_BYTES", "run_staged", "StagedOperand", "StagedP2P", "device_errors", "side_stream"]

#: Pipeline unit of large element-wise collectives, in bytes: large enough
#: that a call's fixed cost (~100 us) is noise next to its transfer, small
#: enough that 64 MiB makes 16 chunks to overlap.
PIPELINE_CHUNK_BYTES = 4 << 20

_SIDE_STREAMS: dict[tuple[DeviceAdapter, Hashable, str], Any] = {}


def side_stream(adapter: DeviceAdapter, device: Hashable, purpose: str) -> Any:
    """The process's ``purpose`` stream on ``device`` ("d2h", "h2d"), made on first use."""
    key = (adapter, device, purpose)
    stream = _SIDE_STREAMS.get(key)
    if stream is None:
        stream = _SIDE_STREAMS[key] = adapter.new_stream(device)
    return stream


class device_errors:  # noqa: N801 (a context manager, used as one: with device_errors(what))
    """Translate the GPU library's exceptions into :class:`DeviceError` (``from`` the original).

    A class, not ``contextlib.contextmanager``: a device call enters several
    of these, and a generator-based one costs several times as much.
    """

    __slots__ = ("what",)

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        # torch.cuda's RuntimeError, CuPy's CUDARuntimeError / NcclError; not ours, not a cancellation
        if isinstance(exc, Exception) and not isinstance(exc, AsyncDistError):
            raise DeviceError(f"{self.what}: {type(exc).__name__}: {exc}") from exc


class Lane:
    """One device's streams within one staged operation."""

    __slots__ = ("adapter", "device", "caller", "d2h", "h2d", "wrote", "done")

    def __init__(self, adapter: DeviceAdapter, device: Hashable) -> None:
        self.adapter, self.device = adapter, device
        self.caller = caller_stream(adapter, device)
        start = adapter.record_event(self.caller)
        self.d2h = side_stream(adapter, device, "d2h")
        self.h2d = side_stream(adapter, device, "h2d")
        adapter.stream_wait(self.d2h, start)  # copy in after the caller's queued work ...
        adapter.stream_wait(self.h2d, start)  # ... and write no output that work still uses
        self.wrote = False
        self.done: Any = None

    def finish(self) -> Completion | None:
        """After the last copy back: the caller's stream waits for the copies (no host wait)."""
        if not self.wrote:
            return None
        if self.done is None:
            self.done = self.adapter.record_event(self.h2d)
            self.adapter.stream_wait(self.caller, self.done)
        return (self.adapter, self.device, self.done)


class Lanes(dict):
    """The lanes of one operation, by (adapter, device)."""

    def lane(self, adapter: DeviceAdapter, device: Hashable) -> Lane:
        lane = self.get((adapter, device))
        if lane is None:
            lane = self[(adapter, device)] = Lane(adapter, device)
        return lane

    def finish(self) -> list[Completion]:
        return [c for c in (lane.finish() for lane in self.values()) if c is not None]


class StagedOperand:
    """One device array, its pinned block and its host stand-in (``host``)."""

    __slots__ = ("adapter", "array", "lane", "block", "host", "nbytes", "itemsize", "reads", "writes", "_read", "_wrote")

    def __init__(self, array: Any, adapter: DeviceAdapter, lanes: Lanes, name: str, *, reads: bool, writes: bool) -> None:
        dtype, shape = adapter.dtype_name(array), adapter.shape(array)
        problem = adapter.problem(array)
        if problem is None and dtype not in ITEMSIZES:
            problem = "has a dtype asyncdist does not know"
        if problem is not None:
            raise UnsupportedBufferError(f"{name} ({adapter.name} device array {signature(dtype, shape)}) {problem}")
        self.adapter, self.array, self.reads, self.writes = adapter, array, reads, writes
        self.lane = lanes.lane(adapter, adapter.device_of(array))
        self.nbytes = adapter.nbytes(array)
        self.itemsize = ITEMSIZES[dtype]
        self.block = pool_for(adapter).acquire(self.nbytes)
        self.host = adapter.host_view(self.block.pinned, array)
        self._read: Any = None
        self._wrote = False

    def fill(self, start: int = 0, stop: int | None = None) -> Any:
        """Queue the copy of bytes ``[start, stop)`` to the stand-in; return its event."""
        a, stream = self.adapter, self.lane.d2h
        a.copy_to_host(self.block.pinned, self.array, start, self.nbytes if stop is None else stop, stream)
        a.keep_alive(self.array, stream)
        self._read = a.record_event(stream)
        return self._read

    def drain(self, start: int = 0, stop: int | None = None) -> None:
        """Queue the copy of the stand-in's bytes ``[start, stop)`` back into the array."""
        a, stream = self.adapter, self.lane.h2d
        a.copy_to_device(self.array, self.block.pinned, start, self.nbytes if stop is None else stop, stream)
        a.keep_alive(self.array, stream)
        self._wrote = self.lane.wrote = True

    def release(self) -> None:
        """Return the block to the pool, reusable once the device is done with it.
        Call after the lane's :meth:`Lane.finish`."""
        pool_for(self.adapter).release(self.block, self.lane.done if self._wrote else self._read, keep=self.array)


async def _copied_in(operands: list[StagedOperand], operation: DeviceWait) -> None:
    for op in operands:
        if op._read is not None:
            await wait_events(op.adapter, [op._read], operation=operation)


def _stand_ins(spec: Spec, arguments: dict[str, Any], rank: int, lanes: Lanes, operands: list[StagedOperand]) -> dict[str, Any]:
    """``arguments`` with every device array replaced by its stand-in."""
    root = arguments.get(spec.root) if spec.root else None
    host_args = dict(arguments)

    def stage(value: Any, name: str, reads: bool, writes: bool) -> Any:
        adapter = adapter_for(value)
        if adapter is None:
            return value
        op = StagedOperand(value, adapter, lanes, name, reads=reads, writes=writes)
        operands.append(op)
        return op.host

    for operand in spec.operands:
        value = arguments.get(operand.arg)
        reads, writes = operand.read_on(rank, root), operand.written_on(rank, root)
        if operand.many and isinstance(value, (list, tuple)):
            host_args[operand.arg] = [stage(v, f"{operand.arg}[{i}]", reads, writes) for i, v in enumerate(value)]
        elif not operand.many:
            host_args[operand.arg] = stage(value, operand.arg, reads, writes)
    return host_args


def _pipeline(name: str, arguments: dict[str, Any]) -> list[tuple[int, int]] | None:
    """The byte ranges of a pipelined call's chunks, or None to stage it whole."""
    if name not in PIPELINED:
        return None
    tensor = arguments.get("tensor")
    adapter = adapter_for(tensor)
    if adapter is None or adapter.problem(tensor) is not None:
        return None
    itemsize = ITEMSIZES.get(adapter.dtype_name(tensor))
    nbytes = adapter.nbytes(tensor)
    if itemsize is None or nbytes < 2 * PIPELINE_CHUNK_BYTES:
        return None
    step = max(1, PIPELINE_CHUNK_BYTES // itemsize) * itemsize
    return [(start, min(start + step, nbytes)) for start in range(0, nbytes, step)]


async def run_staged(
    group: StagingGroup, name: str, spec: Spec, arguments: dict[str, Any], invoke: Callable[[dict[str, Any]], Awaitable[Any]]
) -> Any:
    """Run collective ``name`` of ``group`` with device operands, through pinned stand-ins.

    Loop thread. Call numbers are taken at once (the first step).

    Args:
        group: the :class:`~asyncdist.group.process_group.ProcessGroup` (any :class:`~.seams.StagingGroup`).
        name: the collective's method name (a key of ``SPECS``).
        spec: its operands.
        arguments: its arguments by name, device arrays included.
        invoke: runs the host method on arguments by name.

    Raises:
        UnsupportedBufferError: a device array cannot be staged (non-contiguous, unknown dtype).
        DeviceError: the GPU library failed.
        OperationTimeoutError: the copies in did not finish within the group's timeout.
        Whatever the host operation raises.
    """
    chunks = _pipeline(name, arguments)
    reservation = group.reserve_calls(len(chunks) if chunks else spec.calls(arguments))
    lanes, operands = Lanes(), list[StagedOperand]()
    what = f"{name} on group {group.name!r} (device staging)"
    operation = group.calls.device_operation(name, what)
    try:
        with device_errors(what):
            host_args = _stand_ins(spec, arguments, group.rank, lanes, operands)
        if chunks is not None:
            return await _pipelined(operands[0], chunks, host_args, invoke, reservation, operation, what)
        with device_errors(what):
            for op in operands:
                if op.reads:
                    op.fill()
        await _copied_in(operands, operation)
        with reservation.active():
            result = await invoke(host_args)
        with device_errors(what):
            for op in operands:
                if op.writes:
                    op.drain()
        return result
    except BaseException as exc:
        reservation.abandon(exc)
        raise
    finally:
        _finish(lanes, operands)


def _finish(lanes: Lanes, operands: list[StagedOperand]) -> None:
    completions = lanes.finish()
    if completions:
        note_result(completions)
    for op in operands:
        op.release()


async def _pipelined(
    op: StagedOperand,
    chunks: list[tuple[int, int]],
    host_args: dict[str, Any],
    invoke: Callable[[dict[str, Any]], Awaitable[Any]],
    reservation: CallNumbers,
    operation: DeviceWait,
    what: str,
) -> Any:
    flat, size = op.host.reshape(-1), op.itemsize
    with device_errors(what):
        events = [op.fill(start, stop) for start, stop in chunks] if op.reads else []
    result = None
    for i, (start, stop) in enumerate(chunks):
        if events:
            await wait_events(op.adapter, [events[i]], operation=operation)
        with reservation.active():
            result = await invoke({**host_args, "tensor": flat[start // size : stop // size]})
        if op.writes:
            with device_errors(what):
                op.drain(start, stop)
    return result


class StagedP2P:
    """A device tensor's stand-in for one send (copied in) or one receive (copied back).

    Loop thread. ``host`` is what the engine sends from or receives into.
    """

    __slots__ = ("_lanes", "_op", "what", "host")

    def __init__(self, tensor: Any, adapter: DeviceAdapter, *, send: bool, what: str) -> None:
        self._lanes = Lanes()
        self.what = what
        with device_errors(what):
            self._op = StagedOperand(tensor, adapter, self._lanes, "tensor", reads=send, writes=not send)
            if send:
                self._op.fill()
        self.host = self._op.host

    async def ready(self, operation: DeviceWait) -> None:
        """Return once the copy in (of a send) is done, within ``operation``'s deadline."""
        await _copied_in([self._op], operation)

    def write_back(self, future: asyncio.Future | None = None) -> None:
        """Queue the copy back (of a receive); the caller's stream waits for it, and
        so does ``Work.wait()`` on ``future`` (default: the running task)."""
        with device_errors(self.what):
            self._op.drain()
            note_result(self._lanes.finish(), future)

    def release(self) -> None:
        """Return the pinned block (once, whatever happened)."""
        self._lanes.finish()
        self._op.release()

"""A group's NCCL communicator (through ``cupy.cuda.nccl``), and running ops on it.

A group made with ``backend="nccl"`` (or ``"cpu:gloo,cuda:nccl"``), or given
:func:`asyncdist.gpu.use_nccl`, sends the device operands of its collectives
and point-to-point ops here instead of through pinned staging; host operands
still go over asyncdist's own transport.

* **The communicator** is made at the group's first device op, on the
  device of that op's tensors, as torch does: group rank 0 makes a unique id
  (``nccl.get_unique_id()``), puts it in the group's store, the others read
  it there, and every member calls ``NcclCommunicator(size, id, rank)`` in a
  worker thread (it blocks until all have joined; the loop does not).
* **Order.** NCCL requires every member to issue its ops on a communicator
  in the same order. Each op takes its turn at its first step (like a host
  collective takes its call number) and issues when the ops before it have
  issued, so the first op's wait for the communicator delays the others
  without reordering them.
* **Streams.** The ops run on one stream per communicator, which first
  waits for an event recorded on the caller's current stream: they are
  ordered after the caller's queued work and never block the host.
* **Completion** is an event recorded after the op, polled from the loop
  (:mod:`.poll`), with NCCL's asynchronous error checked between polls.
  Then the caller's stream waits for the event (a no-op by then, kept for
  torch's rule) and ``Work.wait()`` does the same for the waiting thread's
  stream, so Work and the await API behave as on the host.
* **Failure.** A timeout or an NCCL error aborts the communicator (its
  kernels would otherwise spin forever); every later device op of the group
  raises DeviceError naming the first failure.

Loop thread only.
"""

from __future__ import annotations

import asyncio
from typing import Any, Hashable, Protocol

from ..errors import AsyncDistError, DeviceError, InvalidArgumentError, OperationCancelledError
from ..rendezvous.store import STORE_EXECUTOR
from .callers import caller_stream, note_result
from .device import DeviceAdapter, adapter_for
from .nccl_ops import ISSUERS, Issue
from .operands import SPECS
from .poll import wait_events
from .pinned_staging import device_errors
from .seams import DeviceWait, IdStore, NcclGroup

__all__ = ["NcclBackend", "NcclUser"]


def _id_bytes(unique_id: tuple[int, ...]) -> bytes:
    return bytes(b & 0xFF for b in unique_id)  # NCCL's id is 128 C chars, signed here


def _id_tuple(raw: bytes) -> tuple[int, ...]:
    return tuple(b - 256 if b > 127 else b for b in raw)


class NcclBackend:
    """The NCCL side of one group. Made by ``use_nccl``; the communicator comes later."""

    def __init__(self, group: NcclGroup, store: IdStore | None) -> None:
        if store is None:
            raise InvalidArgumentError(f"group {group.name!r} has no store to pass the NCCL unique id through")
        self._group = group
        self._store = store
        # Every rank makes its groups in the same order, so the context id agrees across ranks.
        self._key = f"nccl/{group.name}/{group.calls.collective_context}"
        self._comm: Any = None
        self._nccl: Any = None
        self._adapter: DeviceAdapter | None = None
        self._device: Hashable = None
        self._stream: Any = None
        self._version = 0
        self._tail: asyncio.Future | None = None  # issued when done: the order of ops
        self._batch: _Batch | None = None  # sends and receives being gathered into one group call
        self._failed: BaseException | None = None
        group.on_close(self.close)

    # -- entry points ------------------------------------------------------------

    async def collective(self, name: str, arguments: dict[str, Any]) -> None:
        """Run collective ``name`` (arguments by name, device arrays in them) on NCCL."""
        what = f"{name} on group {self._group.name!r} (NCCL)"
        operation = self._group.calls.device_operation(name, what)
        previous, mine = self._take_turn()
        try:
            start = _Start(_device_arrays(name, arguments), what)
            await self._ready(previous, start, what)
            done, issue = self._issue([start], [(name, arguments)], what, grouped=False)
        finally:
            mine.set_result(None)
        await self._complete(start, done, operation, what)
        del issue  # kept the op's temporaries (scaled copies) alive until now

    async def p2p(self, kind: str, tensor: Any, peer: int | None) -> int | None:
        """Send ``tensor`` to, or receive it from, group rank ``peer``; a receive returns ``peer``.

        The sends and receives started in one step of the loop (one
        ``batch_isend_irecv``, or an isend and an irecv started together) are
        issued as one NCCL group call, so that ranks exchanging data cannot
        deadlock each other.
        """
        group = self._group
        if peer is None:
            raise InvalidArgumentError("a receive from any source (src=None) is not supported with NCCL; name the sender")
        group.members.peer(peer, "dst" if kind == "send" else "src")
        what = f"{kind} {'to' if kind == 'send' else 'from'} rank {peer} on group {group.name!r} (NCCL)"
        loop = asyncio.get_running_loop()
        operation = group.calls.device_operation(kind, what)
        start = _Start([tensor], what)
        batch = self._batch
        if batch is None:
            batch = self._batch = _Batch(loop.create_future())
            asyncio.ensure_future(self._flush(batch, *self._take_turn()))
        batch.items.append((start, (kind, {"tensor": tensor, "peer": peer})))
        done = await asyncio.shield(batch.done)
        await self._complete(start, done, operation, what)
        return peer if kind == "recv" else None

    async def _flush(self, batch: _Batch, previous: asyncio.Future | None, mine: asyncio.Future) -> None:
        self._batch = None  # first step: the ops started before it are in, later ones make a new batch
        what = f"{len(batch.items)} sends/receives on group {self._group.name!r} (NCCL)"
        try:
            starts = [start for start, _ in batch.items]
            if len({(s.adapter, s.device) for s in starts}) != 1:
                raise InvalidArgumentError(f"{what}: the tensors of one batch must be on one device")
            await self._ready(previous, starts[0], what)
            done, _ = self._issue(starts, [op for _, op in batch.items], what, grouped=True)
            batch.done.set_result(done)
        except BaseException as exc:
            batch.done.set_exception(exc)
            batch.done.exception()  # every waiter re-raises it; not "never retrieved"
        finally:
            mine.set_result(None)

    # -- the steps of an op ---------------------------------------------------------

    def _take_turn(self) -> tuple[asyncio.Future | None, asyncio.Future]:
        """This op's place in the communicator's order: wait for ``previous``, set ``mine`` once issued."""
        previous, mine = self._tail, asyncio.get_running_loop().create_future()
        self._tail = mine
        return previous, mine

    async def _ready(self, previous: asyncio.Future | None, start: _Start, what: str) -> None:
        if previous is not None and not previous.done():
            await previous
        self._check_usable(start.adapter, start.device, what)
        if self._comm is None:
            await self._create(start.adapter, start.device, what)

    def _issue(self, starts: list[_Start], ops: list[tuple[str, dict[str, Any]]], what: str, *, grouped: bool) -> tuple[Any, Issue]:
        group, adapter = self._group, starts[0].adapter
        issue = Issue(self._comm, self._nccl, adapter, self._stream, group.rank, group.size, self._version)
        with device_errors(what):
            for start in starts:
                adapter.stream_wait(self._stream, start.event)
            if grouped:
                with issue.group():
                    for name, arguments in ops:
                        ISSUERS[name](issue, **arguments)
            else:
                for name, arguments in ops:
                    ISSUERS[name](issue, **arguments)
            for start in starts:
                for array in start.arrays:
                    adapter.keep_alive(array, self._stream)
            return adapter.record_event(self._stream), issue

    async def _complete(self, start: _Start, done: Any, operation: DeviceWait, what: str) -> None:
        try:
            await wait_events(start.adapter, [done], operation=operation, check=self._check_async_error)
        except BaseException as exc:
            self._fail(exc)
            raise
        with device_errors(what):
            start.adapter.stream_wait(start.caller, done)
        note_result([(start.adapter, start.device, done)])

    def _check_usable(self, adapter: DeviceAdapter, device: Hashable, what: str) -> None:
        if self._failed is not None:
            raise DeviceError(f"{what}: the group's NCCL communicator was aborted after: {self._failed}") from self._failed
        if self._comm is None:
            return
        assert self._adapter is not None, "set with the communicator"
        if adapter is not self._adapter or device != self._device:
            raise InvalidArgumentError(
                f"{what}: the group's NCCL communicator is on {self._adapter.name} device {self._device!r}; "
                f"this op's tensors are on {adapter.name} device {device!r}"
            )

    async def _create(self, adapter: DeviceAdapter, device: Hashable, what: str) -> None:
        group = self._group
        loop = asyncio.get_running_loop()
        nccl = adapter.nccl()
        with device_errors(what):
            if group.rank == 0:
                unique_id = nccl.get_unique_id()
                await loop.run_in_executor(STORE_EXECUTOR, self._store.set, self._key, _id_bytes(unique_id))
            else:
                unique_id = _id_tuple(await loop.run_in_executor(STORE_EXECUTOR, self._store.get, self._key))

            def create() -> Any:
                with adapter.on_device(device):
                    return nccl.NcclCommunicator(group.size, unique_id, group.rank)

            comm = await loop.run_in_executor(None, create)  # blocks until every member has joined
            with adapter.on_device(device):
                self._stream = adapter.new_stream(device)
            self._version = nccl.get_version()
        self._comm, self._nccl, self._adapter, self._device = comm, nccl, adapter, device

    def _check_async_error(self) -> None:
        check = getattr(self._comm, "check_async_error", None)
        if check is not None:
            with device_errors(f"NCCL communicator of group {self._group.name!r}"):
                check()

    def _fail(self, error: BaseException) -> None:
        if self._failed is None:
            self._failed = error if isinstance(error, AsyncDistError) else OperationCancelledError(str(error) or "cancelled")
        comm = self._comm
        if comm is not None:
            self._comm = None
            try:
                comm.abort()
            except Exception:  # already broken: nothing more to release
                pass

    def close(self) -> None:
        """Release the communicator (group close)."""
        comm, self._comm = self._comm, None
        if comm is not None:
            comm.destroy()


class _Start:
    """Where an op's operands live, and the event on the caller's stream it must follow
    (recorded at the op's first step: after the caller's work queued so far)."""

    __slots__ = ("arrays", "adapter", "device", "caller", "event")

    def __init__(self, arrays: list[Any], what: str) -> None:
        self.arrays = arrays
        self.adapter, self.device = _placement(arrays, what)
        with device_errors(what):
            self.caller = caller_stream(self.adapter, self.device)
            self.event = self.adapter.record_event(self.caller)


class NcclUser(NcclGroup, Protocol):
    """A group that sends its device operands through :attr:`nccl` when it is set (:func:`~asyncdist.gpu.use_nccl`)."""

    nccl: NcclBackend | None


class _Batch:
    """Sends and receives started together, issued as one group call."""

    __slots__ = ("done", "items")

    def __init__(self, done: asyncio.Future) -> None:
        self.done = done  # the completion event once issued, or the error
        self.items: list[tuple[_Start, tuple[str, dict[str, Any]]]] = []


def _device_arrays(name: str, arguments: dict[str, Any]) -> list[Any]:
    arrays = []
    for operand in SPECS[name].operands:
        value = arguments.get(operand.arg)
        for v in value if operand.many and isinstance(value, (list, tuple)) else [value]:
            if v is not None:
                arrays.append(v)
    return arrays


def _placement(arrays: list[Any], what: str) -> tuple[DeviceAdapter, Hashable]:
    """The one adapter and device every operand is on."""
    places = set()
    for array in arrays:
        adapter = adapter_for(array)
        if adapter is None:
            raise InvalidArgumentError(f"{what}: every tensor must be on the GPU with NCCL, got a {type(array).__name__}")
        problem = adapter.problem(array)
        if problem is not None:
            raise InvalidArgumentError(f"{what}: a {adapter.name} device array {problem}")
        places.add((adapter, adapter.device_of(array)))
    if len(places) != 1:
        raise InvalidArgumentError(f"{what}: every tensor must be on one device, got {len(places)} devices")
    return places.pop()

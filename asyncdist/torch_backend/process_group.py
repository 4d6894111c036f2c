"""``AsyncdistProcessGroup``: torch's ``ProcessGroup`` API over an asyncdist group.

torch.distributed calls these methods with its own argument shapes (lists of
tensors, ``*Options`` structs with a ``reduceOp`` and a ``rootRank``); each
one picks out what asyncdist's await API takes, starts that coroutine (or
``isend``/``irecv``) on the backend's loop thread, and returns a
:class:`~.work.TorchWork` at once. Checks, algorithms and error messages all
live below, in :class:`asyncdist.group.process_group.ProcessGroup`: this class
only translates.

Which names: torch's Python functions call ``allreduce``, ``broadcast``,
``reduce``, ``allgather``, ``all_gather_single``, ``gather``, ``scatter``,
``reduce_scatter``, ``reduce_scatter_single``, ``all_to_all_single``,
``alltoall``, ``barrier``, ``send``, ``recv``, ``recv_anysource`` and the
``*_coalesced`` variants; C++ callers (DDP's reducer) reach the same methods
through torch's ``PyProcessGroup`` trampoline. The older names
(``_allgather_base``, ``_reduce_scatter_base``, ``alltoall_base``,
``allgather_into_tensor_coalesced``, ``reduce_scatter_tensor_coalesced``) are
aliases. They take torch.distributed's one calling convention, a list of
tensors and an ``*Options`` struct, and live in a base class of their own,
``_TorchCalls``: torch's stubs declare each name with the convenience forms
of its C++ binding too, which no caller of a Python backend uses.

Two additions to translating: ``allreduce`` of a sparse COO tensor sums it
as gloo does (:mod:`.sparse`), and while a torch profiler runs each call is
one asynchronous event named as gloo's, with gloo's choice of input shapes
(:mod:`.profiled_work`).

Ordering: a collective takes its group's next call number when its
coroutine first runs on the loop, and tasks first run in the order they
were started, so the n-th collective started on every rank is matched with
the n-th of the others, as torch requires. The coalesced calls pack their
tensors and make one call per dtype (:mod:`asyncdist.group.packing`),
numbered together before the first runs.

Thread affinity: any thread but the loop's own (there the hop that starts
an operation raises :class:`~asyncdist.errors.WrongThreadError`); ``.then()``
callbacks of the Works' futures run on other threads (see :mod:`.work`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Coroutine, Sequence

import torch
import torch.distributed as tdist

from ..errors import InvalidArgumentError, WrongThreadError
from ..loop.thread import LoopThread
from ..group.process_group import ProcessGroup
from ..group.work import Work
from . import arguments
from .profiled_work import started
from .sparse import all_reduce_sparse
from .work import TorchWork

if TYPE_CHECKING:
    from torch import Tensor
    from torch._C._distributed_c10d import (
        AllgatherOptions,
        AllreduceCoalescedOptions,
        AllreduceOptions,
        AllToAllOptions,
        BarrierOptions,
        BroadcastOptions,
        GatherOptions,
        ReduceOptions,
        ReduceScatterOptions,
        ScatterOptions,
    )

__all__ = ["AsyncdistProcessGroup", "BACKEND_NAME", "DEVICES"]

# asyncdist_torch_hook, which imports nothing of asyncdist, registers the backend with
# copies of these two (tests/torch_backend/test_entry_point.py checks that they agree).

#: The name under which the backend is registered with torch.
BACKEND_NAME = "asyncdist"
#: The devices whose tensors the backend serves (CUDA through pinned staging).
DEVICES = ["cpu", "cuda"]

# torch's SHRINK_ABORT flag (torch.distributed.distributed_c10d): revoke before shrinking.
_SHRINK_ABORT = 0x01

Operation = Callable[[ProcessGroup], Coroutine[Any, Any, Any]]
class _TorchCalls:
    """The operations, in the one calling convention torch.distributed uses:
    a list of tensors and an ``*Options`` struct (see the module docstring).

    torch's stubs also declare, for most of these names, the convenience
    forms of its C++ binding (one tensor, ``op=``, ``timeout=``); nothing in
    torch calls a Python backend that way, and these methods do not take
    them, so they live in this base, apart from torch's ProcessGroup.
    """

    _group: ProcessGroup
    _portal: LoopThread

    # -- starting an operation ------------------------------------------------

    def _start(self, what: str, operation: Operation, outputs: list[Tensor],
               inputs: Sequence[Tensor] | None = None, opts: Any = None) -> TorchWork:
        """Start the coroutine ``operation(group)`` on the loop thread; return its Work at once
        (posted: the caller does not wait for the loop, :meth:`TorchWork.post`).

        Started with :meth:`Work.start`, so that a timed-out ``wait`` names the
        call and the peers it waits on.
        ``inputs`` (default ``outputs``) are the tensors whose shapes the
        profiler event records, gloo's choice for each operation. A call whose
        ``opts.asyncOp`` is False (torch's Python API without ``async_op``,
        which waits on the Work at once) runs to completion here instead, as
        the facade's blocking calls do (:meth:`TorchWork.ran`).
        """
        group = self._group

        def start() -> Work:
            return Work.start(lambda: operation(group), f"{what} on group {group.name!r}", outputs,
                              rank=group.global_rank(group.rank))

        waited_at_once = opts is not None and not getattr(opts, "asyncOp", True)  # (torch before 2.7 has none)
        run_now = (lambda: operation(group)) if waited_at_once else None
        return started(self._portal, what, start, outputs, outputs if inputs is None else inputs, run_now)

    def _start_p2p(self, what: str, operation: Callable[[ProcessGroup], Work], outputs: list[Tensor]) -> TorchWork:
        """Start ``operation(group)``, an ``isend`` or ``irecv`` that makes its own Work."""
        group = self._group
        return started(self._portal, what, lambda: operation(group), outputs, outputs)

    # -- collectives ------------------------------------------------------------

    def allreduce(self, tensors: list[Tensor], opts: AllreduceOptions | None = None) -> TorchWork:
        tensor, op = arguments.one(tensors, "allreduce"), arguments.op(opts)
        if tensor.layout == torch.sparse_coo:  # summed as gloo sums them (.sparse)
            return self._start("all_reduce", lambda g: all_reduce_sparse(g, tensor, op), [tensor], opts=opts)
        return self._start("all_reduce", lambda g: g.all_reduce(tensor, op), [tensor], opts=opts)

    def allreduce_coalesced(self, tensors: list[Tensor], opts: AllreduceCoalescedOptions | None = None) -> TorchWork:
        op = arguments.op(opts)
        return self._start("all_reduce_coalesced", lambda g: g.all_reduce_coalesced(tensors, op), list(tensors),
                           opts=opts)

    def broadcast(self, tensors: list[Tensor], opts: BroadcastOptions | None = None) -> TorchWork:
        tensor, root = arguments.one(tensors, "broadcast"), arguments.root(opts)
        return self._start("broadcast", lambda g: g.broadcast(tensor, root), [tensor], opts=opts)

    def reduce(self, tensors: list[Tensor], opts: ReduceOptions | None = None) -> TorchWork:
        tensor, root, op = arguments.one(tensors, "reduce"), arguments.root(opts), arguments.op(opts)
        return self._start("reduce", lambda g: g.reduce(tensor, root, op), [tensor], opts=opts)

    def allgather(self, output_tensors: list[list[Tensor]], input_tensors: list[Tensor],
                  opts: AllgatherOptions | None = None) -> TorchWork:
        outputs, tensor = arguments.one(output_tensors, "allgather"), arguments.one(input_tensors, "allgather")
        return self._start("all_gather", lambda g: g.all_gather(outputs, tensor), list(outputs), [tensor],
                           opts=opts)

    def allgather_coalesced(self, output_lists: list[list[Tensor]], input_list: list[Tensor],
                            opts: AllgatherOptions | None = None) -> TorchWork:
        # output_lists[r][i] receives rank r's input_list[i]: gathered packed, then copied there.
        flats = [torch.empty(len(output_lists) * t.numel(), dtype=t.dtype, device=t.device) for t in input_list]

        async def operation(g: ProcessGroup) -> None:
            await g.all_gather_into_tensor_coalesced(flats, input_list)
            for rank, per_rank in enumerate(output_lists):
                for flat, out in zip(flats, per_rank, strict=True):
                    out.copy_(flat.view(len(output_lists), -1)[rank].view_as(out))

        return self._start("all_gather_coalesced", operation, [t for per_rank in output_lists for t in per_rank],
                           input_list, opts=opts)

    def all_gather_single(self, output: Tensor, input: Tensor, opts: AllgatherOptions | None = None) -> TorchWork:
        return self._start("all_gather_into_tensor", lambda g: g.all_gather_into_tensor(output, input), [output],
                           [input], opts=opts)

    def all_gather_single_coalesced(self, outputs: list[Tensor], inputs: list[Tensor],
                                    opts: AllgatherOptions | None = None) -> TorchWork:
        return self._start(
            "all_gather_into_tensor_coalesced",
            lambda g: g.all_gather_into_tensor_coalesced(outputs, inputs),
            list(outputs), inputs, opts=opts,
        )

    def gather(self, output_tensors: list[list[Tensor]], input_tensors: list[Tensor],
               opts: GatherOptions | None = None) -> TorchWork:
        tensor, root = arguments.one(input_tensors, "gather"), arguments.root(opts)
        gather_list = output_tensors[0] if output_tensors else None  # only the root has a list
        return self._start("gather", lambda g: g.gather(tensor, gather_list, root), list(gather_list or []), [tensor],
                           opts=opts)

    def scatter(self, output_tensors: list[Tensor], input_tensors: list[list[Tensor]],
                opts: ScatterOptions | None = None) -> TorchWork:
        tensor, root = arguments.one(output_tensors, "scatter"), arguments.root(opts)
        scatter_list = input_tensors[0] if input_tensors else None  # only the root has a list
        return self._start("scatter", lambda g: g.scatter(tensor, scatter_list, root), [tensor], scatter_list or [],
                           opts=opts)

    def reduce_scatter(self, output_tensors: list[Tensor], input_tensors: list[list[Tensor]],
                       opts: ReduceScatterOptions | None = None) -> TorchWork:
        output, inputs = arguments.one(output_tensors, "reduce_scatter"), arguments.one(input_tensors, "reduce_scatter")
        op = arguments.op(opts)
        return self._start("reduce_scatter", lambda g: g.reduce_scatter(output, inputs, op), [output], inputs,
                           opts=opts)

    def reduce_scatter_single(self, output: Tensor, input: Tensor,
                              opts: ReduceScatterOptions | None = None) -> TorchWork:
        op = arguments.op(opts)
        return self._start("reduce_scatter_tensor", lambda g: g.reduce_scatter_tensor(output, input, op), [output],
                           [input], opts=opts)

    def reduce_scatter_single_coalesced(self, outputs: list[Tensor], inputs: list[Tensor],
                                        opts: ReduceScatterOptions | None = None) -> TorchWork:
        op = arguments.op(opts)
        return self._start(
            "reduce_scatter_tensor_coalesced",
            lambda g: g.reduce_scatter_tensor_coalesced(outputs, inputs, op),
            list(outputs), inputs, opts=opts,
        )

    def all_to_all_single(self, output: Tensor, input: Tensor, output_split_sizes: Sequence[int],
                          input_split_sizes: Sequence[int], opts: AllToAllOptions | None = None) -> TorchWork:
        out_splits, in_splits = arguments.splits(output_split_sizes), arguments.splits(input_split_sizes)
        return self._start(
            "all_to_all_single", lambda g: g.all_to_all_single(output, input, out_splits, in_splits), [output], [input],
            opts=opts,
        )

    def alltoall(self, output_tensors: list[Tensor], input_tensors: list[Tensor],
                 opts: AllToAllOptions | None = None) -> TorchWork:
        return self._start("all_to_all", lambda g: g.all_to_all(output_tensors, input_tensors), list(output_tensors),
                           input_tensors, opts=opts)

    def barrier(self, opts: BarrierOptions | None = None) -> TorchWork:
        return self._start("barrier", lambda g: g.barrier(), [], opts=opts)

    # torch's older names for the same calls (C++ callers and older torch code).
    _allgather_base = all_gather_single
    allgather_into_tensor_coalesced = all_gather_single_coalesced
    _reduce_scatter_base = reduce_scatter_single
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced
    alltoall_base = all_to_all_single

    # -- point to point ---------------------------------------------------------

    def send(self, tensors: list[Tensor], dst: int, tag: int) -> TorchWork:
        tensor = arguments.one(tensors, "send")
        return self._start_p2p("send", lambda g: g.isend(tensor, dst, tag), [tensor])

    def recv(self, tensors: list[Tensor], src: int, tag: int) -> TorchWork:
        tensor = arguments.one(tensors, "recv")
        return self._start_p2p("recv", lambda g: g.irecv(tensor, src, tag), [tensor])

    def recv_anysource(self, tensors: list[Tensor], tag: int) -> TorchWork:
        tensor = arguments.one(tensors, "recv")
        return self._start_p2p("recv_anysource", lambda g: g.irecv(tensor, None, tag), [tensor])


class AsyncdistProcessGroup(_TorchCalls, tdist.ProcessGroup):  # type: ignore[misc]  # torch's stubs: see _TorchCalls
    """A torch ``ProcessGroup`` whose operations run on asyncdist.

    Made by the backend's creator (:func:`asyncdist.torch_backend.backend.create_backend`),
    one per torch group.

    Args:
        group: the asyncdist world that serves this torch group (its ranks
            are the torch group's ranks).
        portal: the process's loop thread, on which ``group`` lives.
        on_shutdown: called once, with this group, after it is closed.
        on_new: called with each group :meth:`shrink` makes (before torch
            destroys this one), so that the loop thread stays while they live.
    """

    def __init__(
        self,
        group: ProcessGroup,
        portal: LoopThread,
        on_shutdown: Callable[[Any], None],
        on_new: Callable[[Any], None] | None = None,
    ) -> None:
        super().__init__(group.rank, group.size)  # type: ignore[call-arg]  # torch's stub omits its (rank, size) constructor
        self._group = group
        self._portal = portal
        self._on_shutdown: Callable[[Any], None] | None = on_shutdown
        self._hooks = (on_shutdown, on_new)
        self._torch_name = self._torch_desc = ""

    def __repr__(self) -> str:
        return f"<AsyncdistProcessGroup {self._group.name!r} rank {self._group.rank}/{self._group.size}>"

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return BACKEND_NAME

    # A ProcessGroup made in Python has no C++ backend to keep its name and
    # description, where torch's base class looks for them; keep them here.
    def setGroupName(self, name: str) -> None:  # noqa: N802 (torch's names, from here on)
        self._torch_name = name

    def getGroupName(self) -> str:  # noqa: N802
        return self._torch_name

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._torch_desc = desc

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._torch_desc

    @property
    def asyncdist_group(self) -> ProcessGroup:
        """The asyncdist group underneath (loop thread only, as its methods are)."""
        return self._group

    @property
    def loop_thread(self) -> LoopThread:
        """The loop thread the group lives on, where its methods run."""
        return self._portal

    # -- shrinking (torch.distributed.shrink_group) --------------------------------

    def _get_backend(self, device: Any) -> Any:  # torch's stub says Backend: see .shrinking
        """torch's lookup of a group's device backend: this group is its own,
        for CPU and CUDA (torch's ``shrink_group`` asks; see :mod:`.shrinking`).

        Raises:
            InvalidArgumentError: another device type.
        """
        if str(getattr(device, "type", device)).split(":")[0] not in DEVICES:
            raise InvalidArgumentError(f"the asyncdist backend serves CPU and CUDA tensors, not {device}")
        return self

    @property
    def supports_shrinking(self) -> bool:
        """True: ``torch.distributed.shrink_group`` works on an asyncdist group."""
        return True

    def shrink(self, ranks_to_exclude: list[int], shrink_flags: int = 0, opts: Any = None) -> AsyncdistProcessGroup:
        """The backend's part of ``torch.distributed.shrink_group`` (blocking).

        The remaining ranks agree on who is left, the excluded ranks and any
        lost since included (:meth:`asyncdist.group.process_group.ProcessGroup.shrink`);
        ``shrink_flags`` 1 (torch's ``SHRINK_ABORT``) revokes the group first.

        Raises:
            InvalidArgumentError: this rank is among ``ranks_to_exclude``, or ``opts`` were given.
            RankExcludedError: the other ranks excluded this one.
        """
        if opts is not None:
            raise InvalidArgumentError(f"the asyncdist backend takes no pg_options, got {opts!r}")
        group = self._group

        async def shrink() -> ProcessGroup:
            if shrink_flags & _SHRINK_ABORT:
                await group.revoke()
            return await group.shrink(exclude=ranks_to_exclude)

        shrunk = self._portal.run(shrink(), what="shrink_group()")
        on_shutdown, on_new = self._hooks
        new = AsyncdistProcessGroup(shrunk, self._portal, on_shutdown, on_new)
        if on_new is not None:
            on_new(new)
        return new

    # -- lifetime -----------------------------------------------------------------

    def shutdown(self) -> None:
        """Close the asyncdist group: peers still waiting on this rank get
        PeerLostError ("closed its process group"). torch's
        ``destroy_process_group`` calls it; idempotent.

        Raises:
            WrongThreadError: called on the backend's loop thread (in a
                coroutine or callback of asyncdist's); nothing was closed.
        """
        on_shutdown, self._on_shutdown = self._on_shutdown, None
        if on_shutdown is None:
            return
        try:
            self._portal.run(self._group.close(), what="destroy_process_group()")
        except WrongThreadError:
            self._on_shutdown = on_shutdown  # refused before anything closed: still open, still to shut down
            raise
        except BaseException:
            on_shutdown(self)
            raise
        on_shutdown(self)

    abort = shutdown

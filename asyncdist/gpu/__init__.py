"""GPU data: pinned staging for CUDA tensors and CuPy arrays, and NCCL through CuPy.

Two paths take device arrays (see ``docs/gpu.md``):

* **pinned staging** (every group, by default): device operands are copied
  into pooled pinned host buffers on side streams, the host algorithms run
  on those, and results are copied back (:mod:`.staging`);
* **NCCL** (groups made with ``backend="nccl"`` or ``"cpu:gloo,cuda:nccl"``,
  or given :func:`use_nccl`): the whole operation runs as NCCL calls on a
  ``cupy.cuda.nccl.NcclCommunicator`` (:mod:`.nccl`).

Both are written against :class:`~.device.DeviceAdapter`; torch CUDA
tensors and CuPy arrays have one each, and tests plug in a fake device
(:mod:`asyncdist.testing.fake_device`).

Invariant: importing this package imports neither torch, CuPy nor CUDA.
They are imported by :mod:`.torch_cuda` and :mod:`.cupy_cuda`, which are
imported only once an array of theirs is seen.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .device import DeviceAdapter, adapter_for, register_adapter, unregister_adapter
from .pinned_pool import PinnedPool, pool_for
from .seams import IdStore

if TYPE_CHECKING:  # the module itself is imported by use_nccl, once called
    from .nccl import NcclUser

__all__ = ["DeviceAdapter", "adapter_for", "register_adapter", "unregister_adapter", "PinnedPool", "pool_for", "use_nccl"]


def use_nccl(group: NcclUser, store: IdStore | None = None) -> None:
    """Send ``group``'s device operands through NCCL from now on (await API).

    The communicator is created at the group's first device operation (every
    member must make it), with its unique id passed through ``store``.

    Args:
        group: a :class:`~asyncdist.group.process_group.ProcessGroup` this rank is in
            (any :class:`~asyncdist.gpu.nccl.NcclUser`).
        store: the store all members share (default: the group's own, which
            ``init_world`` sets on the world and ``new_group`` passes on).

    Raises:
        InvalidArgumentError: no store to pass the unique id through.
    """
    from .nccl import NcclBackend

    group.nccl = NcclBackend(group, store if store is not None else group.store)

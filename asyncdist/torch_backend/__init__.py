"""asyncdist as a torch.distributed backend: ``init_process_group("asyncdist")``.

Importing this package registers the backend with torch::

    import torch.distributed as dist
    import asyncdist.torch_backend  # registers "asyncdist"

    dist.init_process_group("asyncdist")        # or "cpu:asyncdist"
    dist.all_reduce(tensor)                     # runs on asyncdist's engine

after which every torch collective, send/recv and ``new_group`` on that
backend runs on asyncdist, and so does what torch builds on them
(DistributedDataParallel, ZeroRedundancyOptimizer). See ``docs/torch.md``.

This package is the one part of asyncdist that needs torch: ``import
asyncdist`` never imports it, and it imports torch at once.

* :mod:`.backend` - the creator torch calls per group, ``create_group`` (a
  group from a store, a rank and a size, which :mod:`asyncdist.torchft`
  makes per quorum), and the loop thread that all groups of the process share;
* :mod:`.process_group` - :class:`AsyncdistProcessGroup`, torch's ProcessGroup
  API over an asyncdist group;
* :mod:`.work` - :class:`TorchWork`, torch's Work over an asyncdist operation;
* :mod:`.profiled_work` - the Work while a torch profiler runs, whose
  asynchronous event closes when the operation completes;
* :mod:`.sparse` - ``all_reduce`` of sparse COO tensors, summed as gloo sums them;
* :mod:`.shrinking` - what lets ``torch.distributed.shrink_group`` take the
  group an asyncdist shrink makes;
* the store adapter is :class:`asyncdist.rendezvous.torch_store.TorchStore`
  (the rendezvous layer uses it for torchrun's store too).
"""

from __future__ import annotations

import torch.distributed as tdist

from ..rendezvous.torch_store import TorchStore
from .backend import create_backend
from .process_group import BACKEND_NAME, DEVICES, AsyncdistProcessGroup
from .shrinking import install
from .work import TorchWork

__all__ = ["BACKEND_NAME", "AsyncdistProcessGroup", "TorchWork", "TorchStore", "register"]


def register() -> None:
    """Register the ``"asyncdist"`` backend with torch (idempotent; done on import).

    ``extended_api=True`` makes torch pass the group's name and global ranks,
    which go into asyncdist's error messages. The backend serves CPU tensors,
    and CUDA tensors through pinned staging (``docs/gpu.md``).
    """
    if BACKEND_NAME.upper() not in tdist.Backend._plugins:
        tdist.Backend.register_backend(BACKEND_NAME, create_backend, extended_api=True, devices=DEVICES)
    install()  # torch.distributed.shrink_group on an asyncdist group


register()

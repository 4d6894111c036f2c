"""asyncdist: an asyncio-native message-passing runtime.

Two faces over one core:

* the blocking facade, shaped like ``torch.distributed``::

      import asyncdist as dist
      dist.init_process_group("gloo")          # env://, tcp:// or file://
      dist.send(tensor, dst=1)

* the await API, for asyncio programs and tests::

      world = await asyncdist.init_world("tcp://127.0.0.1:29500", rank=r, world_size=2)
      await world.send(tensor, dst=1)
"""

from __future__ import annotations

from . import errors
from .errors import DistBackendError, DistError, DistNetworkError, DistStoreError, QueueEmptyError
from .facade.lifecycle import (
    destroy_process_group,
    get_backend,
    get_backend_config,
    get_pg_count,
    get_rank,
    get_world_size,
    init_process_group,
    is_available,
    is_initialized,
)
from .facade.p2p import P2POp, batch_isend_irecv, irecv, isend, recv, send
from .facade.collectives import (
    all_gather,
    all_gather_coalesced,
    all_gather_into_tensor,
    all_gather_single,
    all_to_all,
    all_to_all_single,
    broadcast,
    gather,
    scatter,
)
from .facade.barriers import barrier, monitored_barrier
from .facade.groups import (
    GroupMember,
    group,
    get_global_rank,
    get_group_rank,
    get_node_local_rank,
    get_process_group_ranks,
    is_torchelastic_launched,
    new_group,
    new_subgroups,
    new_subgroups_by_enumeration,
    split_group,
)
from .facade.faults import SHRINK_ABORT, SHRINK_DEFAULT, agree, failed_ranks, revoke, shrink_group
from .facade.objects import (
    all_gather_object,
    broadcast_object_list,
    gather_object,
    recv_object_list,
    scatter_object_list,
    send_object_list,
)
from .facade.reductions import (
    all_reduce,
    all_reduce_coalesced,
    reduce,
    reduce_scatter,
    reduce_scatter_single,
    reduce_scatter_tensor,
    supports_complex,
)
from .facade.debugging import breakpoint, dump_trace, get_stats, record_comm
from .facade.elastic import grow_group
from .facade.torch_names import (
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    Backend,
    BackendConfig,
    BarrierOptions,
    BroadcastOptions,
    DebugLevel,
    GatherOptions,
    GroupName,
    RankType,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
    default_pg_timeout,
    get_debug_level,
    get_default_backend_for_device,
    is_backend_available,
    is_gloo_available,
    is_mpi_available,
    is_nccl_available,
    is_ucc_available,
    is_xccl_available,
    reduce_op,
    set_debug_level,
    set_debug_level_from_env,
)
from .group.process_group import ProcessGroup
from .reduce.op import ReduceOp
from .rendezvous.file_store import FileStore
from .rendezvous.hash_store import HashStore
from .rendezvous.store import PrefixStore, Store
from .rendezvous.tcp_store import TCPStore
from .group.work import Work
from .group.world import init_world

__version__ = "0.1.0"

__all__ = [
    "errors",
    "init_world",
    "ProcessGroup",
    "Work",
    "Store",
    "TCPStore",
    "FileStore",
    "HashStore",
    "PrefixStore",
    "init_process_group",
    "destroy_process_group",
    "is_initialized",
    "is_available",
    "get_backend",
    "get_rank",
    "get_world_size",
    "send",
    "recv",
    "isend",
    "irecv",
    "batch_isend_irecv",
    "P2POp",
    "ReduceOp",
    "broadcast",
    "all_reduce",
    "all_reduce_coalesced",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "gather",
    "scatter",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "monitored_barrier",
    "broadcast_object_list",
    "all_gather_object",
    "gather_object",
    "scatter_object_list",
    "send_object_list",
    "recv_object_list",
    "GroupMember",
    "group",
    "new_group",
    "new_subgroups",
    "new_subgroups_by_enumeration",
    "get_group_rank",
    "get_global_rank",
    "get_process_group_ranks",
    "get_node_local_rank",
    "is_torchelastic_launched",
    "split_group",
    "grow_group",
    "shrink_group",
    "agree",
    "revoke",
    "failed_ranks",
    "SHRINK_DEFAULT",
    "SHRINK_ABORT",
    "get_backend_config",
    "get_pg_count",
    "all_gather_coalesced",
    "supports_complex",
    "breakpoint",
    "record_comm",
    "dump_trace",
    "get_stats",
    # torch.distributed's errors (subclasses of torch's once torch is imported)
    "DistError",
    "DistBackendError",
    "DistNetworkError",
    "DistStoreError",
    "QueueEmptyError",
    # torch.distributed's constants, enums and option records
    "Backend",
    "BackendConfig",
    "DebugLevel",
    "GroupName",
    "RankType",
    "default_pg_timeout",
    "get_debug_level",
    "set_debug_level",
    "set_debug_level_from_env",
    "get_default_backend_for_device",
    "is_backend_available",
    "is_gloo_available",
    "is_nccl_available",
    "is_mpi_available",
    "is_ucc_available",
    "is_xccl_available",
    "reduce_op",
    "AllreduceOptions",
    "AllreduceCoalescedOptions",
    "AllToAllOptions",
    "BarrierOptions",
    "BroadcastOptions",
    "GatherOptions",
    "ReduceOptions",
    "ReduceScatterOptions",
    "ScatterOptions",
]

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
from .facade import (
    barrier,
    destroy_process_group,
    get_backend,
    get_rank,
    get_world_size,
    init_process_group,
    irecv,
    is_available,
    is_initialized,
    isend,
    recv,
    send,
)
from .group import ProcessGroup
from .rendezvous.file_store import FileStore
from .rendezvous.hash_store import HashStore
from .rendezvous.store import PrefixStore, Store
from .rendezvous.tcp_store import TCPStore
from .work import Work
from .world import init_world

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
    "barrier",
]

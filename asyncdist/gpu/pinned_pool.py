"""A pool of pinned (page-locked) host buffers, reused across operations.

Pinning memory is slow (``cudaHostAlloc`` of 64 MiB takes milliseconds and
synchronises the device), so a staged operation never allocates per call:
it takes a block from this pool and gives it back with the event after which
the device no longer touches it. A block is handed out again only once that
event is complete, which :meth:`PinnedPool.acquire` checks with a
non-blocking query; if every cached block of the size is still in flight, a
new one is pinned.

Blocks come in power-of-two sizes from 64 KiB (torch's caching host
allocator rounds the same way), so a steady workload of mixed sizes settles
on a few blocks. The pool keeps at most :data:`MAX_CACHED_BYTES` of idle
blocks (``ASYNCDIST_PINNED_POOL_BYTES``, default 1 GiB, read once); beyond
that a returned block is dropped once it is idle.

One pool per adapter (:func:`pool_for`). Any thread: a lock guards the free
lists (the loop thread is the usual caller, but several loops may share a
pool).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

from .. import settings
from .device import DeviceAdapter

__all__ = ["PinnedBlock", "PinnedPool", "pool_for", "MIN_BLOCK_BYTES", "MAX_CACHED_BYTES"]

#: The smallest block, in bytes.
MIN_BLOCK_BYTES = 64 * 1024
#: Idle bytes the pool keeps per adapter (ASYNCDIST_PINNED_POOL_BYTES).
MAX_CACHED_BYTES = settings.current().pinned_pool_bytes


def _size_class(nbytes: int) -> int:
    return max(MIN_BLOCK_BYTES, 1 << max(0, nbytes - 1).bit_length())


class PinnedBlock:
    """A pinned host buffer of ``size`` bytes, lent by a :class:`PinnedPool`.

    Attributes:
        pinned: the adapter's 1-D uint8 host array of ``size`` bytes.
        size: the block's size in bytes (a size class, >= what was asked).
    """

    __slots__ = ("pinned", "size", "_busy_until", "_keep")

    def __init__(self, pinned: Any, size: int) -> None:
        self.pinned = pinned
        self.size = size
        self._busy_until: Any = None  # the event after which the device is done with it
        self._keep: Any = None  # the device array the pending copy touches, held as long


class PinnedPool:
    """Pinned blocks of one adapter, reused once the device is done with them.

    Attributes:
        allocations: how many blocks were pinned so far.
        reuses: how many acquisitions were served from the cache.
    """

    def __init__(self, adapter: DeviceAdapter, max_cached_bytes: int = MAX_CACHED_BYTES) -> None:
        self._adapter = adapter
        self._max_cached = max_cached_bytes
        self._free: defaultdict[int, list[PinnedBlock]] = defaultdict(list)
        self._cached_bytes = 0
        self._lock = threading.Lock()
        self.allocations = 0
        self.reuses = 0

    @property
    def cached_bytes(self) -> int:
        """Bytes of blocks in the pool (idle or waiting for their event)."""
        return self._cached_bytes

    def acquire(self, nbytes: int) -> PinnedBlock:
        """A block of at least ``nbytes`` bytes that the device no longer uses. Never blocks."""
        size = _size_class(nbytes)
        with self._lock:
            blocks = self._free[size]
            for i, block in enumerate(blocks):
                if block._busy_until is None or self._adapter.query(block._busy_until):
                    del blocks[i]
                    block._busy_until = block._keep = None
                    self._cached_bytes -= size
                    self.reuses += 1
                    return block
            self.allocations += 1
        # Pin outside the lock: it can take milliseconds.
        return PinnedBlock(self._adapter.alloc_pinned(size), size)

    def release(self, block: PinnedBlock, after: Any = None, keep: Any = None) -> None:
        """Give ``block`` back; it is reused once ``after`` (an event, or None: now) is complete.

        ``keep`` (the device array a pending copy touches) is held until then,
        so that its memory is not reallocated under the copy.
        """
        with self._lock:
            block._busy_until, block._keep = after, keep
            self._free[block.size].append(block)
            self._cached_bytes += block.size
            if self._cached_bytes > self._max_cached:
                self._trim()

    def _trim(self) -> None:
        for size, blocks in self._free.items():
            keep = []
            for block in blocks:
                idle = block._busy_until is None or self._adapter.query(block._busy_until)
                if idle and self._cached_bytes > self._max_cached:
                    self._cached_bytes -= size
                else:
                    keep.append(block)
            blocks[:] = keep


_POOLS: dict[DeviceAdapter, PinnedPool] = {}
_POOLS_LOCK = threading.Lock()


def pool_for(adapter: DeviceAdapter) -> PinnedPool:
    """The process's pinned pool for ``adapter`` (created on first use). Any thread."""
    pool = _POOLS.get(adapter)
    if pool is None:
        with _POOLS_LOCK:
            pool = _POOLS.setdefault(adapter, PinnedPool(adapter))
    return pool

"""Scratch memory for collectives and early messages, reused across calls.

A large collective needs memory of its own: receive buffers for the ring's
reduce-scatter (``S/2`` with two ranks), a whole message that arrived before
its receive was posted. Allocated afresh on every call, that memory costs a
page fault for every 4 KiB page each time the C allocator hands large
blocks back to the system, which glibc always does for blocks over 32 MiB:
measured here, 5,000 to 11,000 faults (10 to 20 ms) per all_reduce of
64 MiB between two ranks, a third of the call. The pool keeps such blocks
and hands them out again, so that steady-state calls touch warm memory.

What it keeps is bounded (:data:`DEFAULT_KEEP_BYTES`, or
``ASYNCDIST_SCRATCH_KEEP_BYTES``); the oldest blocks go first. A block is
handed back only by a call that completed, so memory a failed call may
still have in flight (a receive withdrawn too late, a peer still reading a
send) is never reused. Thread-safe: one pool serves the whole process.
"""

from __future__ import annotations

import threading
from collections import deque

import numpy as np

from .. import settings
from .host import ITEMSIZES, HostBuffer

__all__ = ["ScratchPool", "pool", "DEFAULT_KEEP_BYTES"]

DEFAULT_KEEP_BYTES = 256 << 20
# Blocks smaller than this are cheap to allocate (and glibc reuses them).
_MIN_POOLED_BYTES = 256 << 10


class ScratchPool:
    """A bounded set of reusable byte blocks.

    Args:
        keep_bytes: the most memory kept between calls.
    """

    def __init__(self, keep_bytes: int = DEFAULT_KEEP_BYTES) -> None:
        self.keep_bytes = keep_bytes
        self._free: deque[np.ndarray] = deque()
        self._lock = threading.Lock()

    @property
    def kept_bytes(self) -> int:
        """Bytes held for reuse right now."""
        with self._lock:
            return sum(block.nbytes for block in self._free)

    def take_bytes(self, nbytes: int) -> np.ndarray:
        """A writable, uninitialised uint8 array of ``nbytes`` (a kept block
        of at most twice the size, or a new one)."""
        if nbytes >= _MIN_POOLED_BYTES:
            with self._lock:
                fits = [i for i, block in enumerate(self._free) if nbytes <= block.nbytes <= 2 * nbytes]
                if fits:
                    best = min(fits, key=lambda i: self._free[i].nbytes)
                    block = self._free[best]
                    del self._free[best]
                    return block[:nbytes]
        return np.empty(nbytes, np.uint8)

    def take(self, dtype: str, numel: int) -> HostBuffer:
        """A flat scratch buffer of ``numel`` elements of ``dtype``."""
        return HostBuffer(self.take_bytes(numel * ITEMSIZES[dtype]).data, dtype, (numel,))

    def give_back(self, block: HostBuffer | np.ndarray) -> None:
        """Keep ``block`` (from :meth:`take` / :meth:`take_bytes`) for reuse.

        The caller must not touch it afterwards, nor may anything in flight.
        """
        array = block.view.obj if isinstance(block, HostBuffer) else block
        base = array.base if isinstance(array, np.ndarray) and array.base is not None else array
        if not isinstance(base, np.ndarray) or base.nbytes < _MIN_POOLED_BYTES:
            return
        with self._lock:
            if any(kept is base for kept in self._free):
                return
            self._free.append(base)
            total = sum(kept.nbytes for kept in self._free)
            while self._free and total > self.keep_bytes:
                total -= self._free.popleft().nbytes

    def clear(self) -> None:
        """Let go of every kept block."""
        with self._lock:
            self._free.clear()


#: The process's pool.
pool = ScratchPool(settings.current().scratch_keep_bytes)

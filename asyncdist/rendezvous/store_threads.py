"""The threads that run blocking store calls for coroutines, and their end.

Store calls block (they are torch's API), so a coroutine runs them on
:data:`STORE_EXECUTOR`: a pool of its own, so that many ranks waiting in
one loop never starve each other or the loop's default executor. This
module owns that pool's threads: they are started on demand, and
:meth:`StoreThreads.release_idle` ends them when no call is running, so
that ``destroy_process_group`` leaves no thread behind (the next call
starts fresh ones).

It must not know any store: it runs plain functions.
"""

from __future__ import annotations

import threading
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any, Callable

__all__ = ["STORE_EXECUTOR", "StoreThreads"]


class StoreThreads(Executor):
    """A thread pool, started on the first :meth:`submit`, that can be ended
    while idle and started again (any thread).

    Args:
        max_workers: the most threads at once.
        name: the threads' name prefix.
    """

    def __init__(self, max_workers: int, name: str) -> None:
        self._max_workers = max_workers
        self._name = name
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._busy = 0  # calls submitted and not yet done

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        """Run ``fn(*args, **kwargs)`` on a pool thread; returns its future."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._max_workers, thread_name_prefix=self._name)
            future = self._pool.submit(fn, *args, **kwargs)
            self._busy += 1
        future.add_done_callback(self._done)  # first: before an awaiting loop learns it is done
        return future

    def _done(self, _: Future) -> None:
        with self._lock:
            self._busy -= 1

    def release_idle(self) -> bool:
        """End the pool's threads and wait for them to exit, unless a call is
        running (then nothing changes); a later :meth:`submit` starts new ones.

        Returns:
            True if no thread of the pool is left.
        """
        with self._lock:
            if self._busy:
                return False
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        return True

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """End the pool as :meth:`concurrent.futures.Executor.shutdown` does;
        unlike a ThreadPoolExecutor's, a later :meth:`submit` starts it again."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait, cancel_futures=cancel_futures)


#: Threads that run the ``async_*`` twins of every store. 64, because every
#: blocked ``async_get`` or ``async_wait`` holds a thread until its keys appear:
#: 8 ranks in one loop each waiting on a few keys must all fit, with room to
#: spare for the calls that would wake them.
STORE_EXECUTOR = StoreThreads(max_workers=64, name="asyncdist-store")

"""The key-value store interface shared by every store, and :class:`PrefixStore`.

A store is the job's rendezvous blackboard: ranks publish addresses, counters and
barriers' arrivals under string keys and block until the others have published
theirs. The API is torch.distributed's ``Store`` with the same names, argument
names and semantics, so code written against ``torch.distributed.TCPStore`` runs
unchanged.

This module owns:

* :class:`Store`, the base class. Its public methods validate arguments (with
  the rules of :mod:`.store_rules`), refuse calls after :meth:`Store.close` with
  :class:`~asyncdist.errors.ClosedError`, turn a subclass's "timed out" answer
  into a :class:`~asyncdist.errors.StoreTimeoutError` naming the keys and the
  timeout, and provide ``async_*`` twins for callers on an event loop.
  Subclasses only implement the small ``_``-prefixed hooks.
* :class:`PrefixStore`, which namespaces keys over another store.
* :data:`DEFAULT_TIMEOUT`, and :data:`STORE_EXECUTOR` (from :mod:`.store_threads`).

It must not know how any concrete store holds its data (dict, file, server), nor
what ``add`` and ``compare_set`` compute: those rules are in :mod:`.store_rules`,
which every concrete store applies to its own data.

Invariants: keys are ``str``; values are stored and returned as ``bytes`` (a
``str`` value is UTF-8 encoded); counters written by ``add`` are ASCII decimal;
hooks see only arguments already normalised. The synchronous methods block the
calling thread (they are torch's API); the ``async_*`` twins run them on
:data:`STORE_EXECUTOR`, a pool dedicated to store calls so that many ranks
waiting in one loop never starve each other or the loop's default executor.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from typing import Any

from ..errors import ClosedError, InvalidArgumentError, StoreTimeoutError
from .store_rules import as_amount, as_key, as_keys, as_value, timeout_seconds
from .store_threads import STORE_EXECUTOR

# timeout_seconds is re-exported: callers normalise timeouts as Store does.
__all__ = [
    "DEFAULT_TIMEOUT",
    "STORE_EXECUTOR",
    "PrefixStore",
    "Store",
    "timeout_seconds",
]

#: torch's default store timeout (``kDefaultTimeout``, 300 s).
DEFAULT_TIMEOUT = timedelta(seconds=300)


class Store:
    """Base class of the key-value stores (torch.distributed's ``Store`` API).

    All public methods may be called from any thread. The synchronous ones block
    the calling thread; inside a coroutine use the ``async_*`` twins instead, which
    run the same call on :data:`STORE_EXECUTOR`. A twin whose awaiting task is
    cancelled still occupies its thread until the call returns or times out.

    Subclasses implement the hooks ``_set``, ``_get``, ``_add``, ``_compare_set``,
    ``_wait``, ``_check``, ``_delete_key``, ``_num_keys`` and ``_close``; ``_get``
    returns ``None`` and ``_wait`` returns the missing keys when the timeout passes.
    """

    def __init__(self, timeout: timedelta | float = DEFAULT_TIMEOUT) -> None:
        self._timeout_s = timeout_seconds(timeout, 0.0)
        self._closed = False
        self._close_lock = threading.Lock()

    # -- timeout ----------------------------------------------------------

    @property
    def timeout(self) -> timedelta:
        """The timeout of ``get`` and of ``wait`` without an explicit timeout."""
        return timedelta(seconds=self._timeout_s)

    def set_timeout(self, timeout: timedelta | float) -> None:
        """Set the default timeout (a ``timedelta`` or seconds)."""
        self._timeout_s = timeout_seconds(timeout, 0.0)

    # -- the torch API ----------------------------------------------------

    def set(self, key: str, value: str | bytes) -> None:
        """Set ``key`` to ``value`` (``str`` is stored UTF-8 encoded)."""
        key, value = as_key(key), as_value(value)
        self._ensure_open("set")
        self._set(key, value)

    def get(self, key: str) -> bytes:
        """Return the value of ``key``, blocking until it is set.

        Raises:
            StoreTimeoutError: ``key`` was not set within :attr:`timeout`.
            ClosedError: the store is, or was meanwhile, closed.
        """
        key = as_key(key)
        self._ensure_open("get")
        timeout = self.timeout.total_seconds()
        value = self._get(key, timeout)
        if value is None:
            self._ensure_open("get")
            raise StoreTimeoutError(
                f"{type(self).__name__}.get: key {key!r} was not set within {timeout:g} s"
            )
        return value

    def add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to the integer at ``key`` (missing: 0).

        Returns:
            The new value. The stored value is its ASCII decimal form.
        """
        key, amount = as_key(key), as_amount(amount)
        self._ensure_open("add")
        return self._add(key, amount)

    def compare_set(
        self, key: str, expected_value: str | bytes, desired_value: str | bytes
    ) -> bytes:
        """Set ``key`` to ``desired_value`` if it holds ``expected_value``.

        A missing key matches ``expected_value == ""``. Returns ``desired_value``
        when the key was set, else the current value, or ``expected_value`` when
        the key is missing (torch's rule: :func:`.store_rules.apply_compare_set`).
        """
        key = as_key(key)
        expected, desired = as_value(expected_value), as_value(desired_value)
        self._ensure_open("compare_set")
        return self._compare_set(key, expected, desired)

    def wait(self, keys: list[str], timeout: timedelta | float | None = None) -> None:
        """Block until every key in ``keys`` is set.

        Args:
            keys: the keys to wait for.
            timeout: how long to wait; defaults to :attr:`timeout`.

        Raises:
            StoreTimeoutError: names the keys still missing at the deadline.
            ClosedError: the store is, or was meanwhile, closed.
        """
        keys = as_keys(keys)
        seconds = timeout_seconds(timeout, self.timeout.total_seconds())
        self._ensure_open("wait")
        missing = self._wait(keys, seconds)
        if missing:
            self._ensure_open("wait")
            raise StoreTimeoutError(
                f"{type(self).__name__}.wait: keys {missing!r} were not set "
                f"within {seconds:g} s"
            )

    def check(self, keys: list[str]) -> bool:
        """Return whether every key in ``keys`` is set, without waiting."""
        keys = as_keys(keys)
        self._ensure_open("check")
        return self._check(keys)

    def delete_key(self, key: str) -> bool:
        """Delete ``key``; return whether it existed."""
        key = as_key(key)
        self._ensure_open("delete_key")
        return self._delete_key(key)

    def num_keys(self) -> int:
        """Return the number of keys set (stores' internal bookkeeping excluded)."""
        self._ensure_open("num_keys")
        return self._num_keys()

    def close(self) -> None:
        """Release the store's resources. Idempotent; later calls raise ClosedError."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- async twins (any loop; each runs the call on STORE_EXECUTOR) -----

    async def _in_executor(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(STORE_EXECUTOR, fn, *args)

    async def async_set(self, key: str, value: str | bytes) -> None:
        """:meth:`set` for coroutines."""
        await self._in_executor(self.set, key, value)

    async def async_get(self, key: str) -> bytes:
        """:meth:`get` for coroutines."""
        return await self._in_executor(self.get, key)

    async def async_add(self, key: str, amount: int) -> int:
        """:meth:`add` for coroutines."""
        return await self._in_executor(self.add, key, amount)

    async def async_compare_set(
        self, key: str, expected_value: str | bytes, desired_value: str | bytes
    ) -> bytes:
        """:meth:`compare_set` for coroutines."""
        return await self._in_executor(self.compare_set, key, expected_value, desired_value)

    async def async_wait(self, keys: list[str], timeout: timedelta | float | None = None) -> None:
        """:meth:`wait` for coroutines."""
        await self._in_executor(self.wait, keys, timeout)

    async def async_check(self, keys: list[str]) -> bool:
        """:meth:`check` for coroutines."""
        return await self._in_executor(self.check, keys)

    async def async_delete_key(self, key: str) -> bool:
        """:meth:`delete_key` for coroutines."""
        return await self._in_executor(self.delete_key, key)

    async def async_num_keys(self) -> int:
        """:meth:`num_keys` for coroutines."""
        return await self._in_executor(self.num_keys)

    # -- for subclasses ---------------------------------------------------

    def _ensure_open(self, op: str) -> None:
        if self._closed:
            raise ClosedError(f"{type(self).__name__}.{op}: the store is closed")

    def _set(self, key: str, value: bytes) -> None:
        raise NotImplementedError

    def _get(self, key: str, timeout: float) -> bytes | None:
        raise NotImplementedError

    def _add(self, key: str, amount: int) -> int:
        raise NotImplementedError

    def _compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        raise NotImplementedError

    def _wait(self, keys: list[str], timeout: float) -> list[str]:
        raise NotImplementedError

    def _check(self, keys: list[str]) -> bool:
        raise NotImplementedError

    def _delete_key(self, key: str) -> bool:
        raise NotImplementedError

    def _num_keys(self) -> int:
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError


class PrefixStore(Store):
    """A view of ``store`` in which every key ``k`` is ``f"{prefix}/{k}"``.

    The timeout is the underlying store's (reading or setting it here reads or
    sets it there, as in torch). ``num_keys`` counts all of the underlying
    store's keys, as torch's does. Closing a PrefixStore does not close the
    underlying store; closing the underlying store makes this one fail with its
    ClosedError.
    """

    def __init__(self, prefix: str, store: Store) -> None:
        if not isinstance(prefix, str):
            raise InvalidArgumentError(f"PrefixStore prefix must be str, not {type(prefix).__name__}")
        if not isinstance(store, Store):
            raise InvalidArgumentError(f"PrefixStore needs a Store, not {type(store).__name__}")
        super().__init__()
        self._prefix = prefix
        self._store = store

    @property
    def underlying_store(self) -> Store:
        """The store this one writes through to."""
        return self._store

    @property
    def timeout(self) -> timedelta:
        return self._store.timeout

    def set_timeout(self, timeout: timedelta | float) -> None:
        self._store.set_timeout(timeout)

    def _p(self, key: str) -> str:
        return f"{self._prefix}/{key}"

    def _set(self, key: str, value: bytes) -> None:
        self._store.set(self._p(key), value)

    def _get(self, key: str, timeout: float) -> bytes | None:
        # The underlying store's timeout is ours, so its StoreTimeoutError (which
        # names the prefixed key) is the one to raise.
        return self._store.get(self._p(key))

    def _add(self, key: str, amount: int) -> int:
        return self._store.add(self._p(key), amount)

    def _compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        return self._store.compare_set(self._p(key), expected, desired)

    def _wait(self, keys: list[str], timeout: float) -> list[str]:
        self._store.wait([self._p(k) for k in keys], timeout)
        return []

    def _check(self, keys: list[str]) -> bool:
        return self._store.check([self._p(k) for k in keys])

    def _delete_key(self, key: str) -> bool:
        return self._store.delete_key(self._p(key))

    def _num_keys(self) -> int:
        return self._store.num_keys()

    def _close(self) -> None:
        pass

"""HashStore: an in-process store, a dict guarded by one condition variable.

For tests and single-process jobs (several ranks as threads or as coroutines of
one loop). It owns nothing but its dict; it knows nothing of processes or files.

Invariants: every read and write holds ``_cond``; every write that may make a key
appear calls ``notify_all``, and close does too, so waiters sleep on the
condition with a deadline and are never woken by a poll. ``get`` and ``wait``
blocked when the store is closed return at once and raise ClosedError.
"""

from __future__ import annotations

import threading

from .store import Store
from .store_rules import apply_add, apply_compare_set

__all__ = ["HashStore"]


class HashStore(Store):
    """An in-memory, thread-safe store (``torch.distributed.HashStore``).

    Example:
        >>> store = HashStore()
        >>> store.add("arrived", 1)
        1
        >>> store.get("arrived")
        b'1'
    """

    def __init__(self) -> None:
        super().__init__()
        self._data: dict[str, bytes] = {}
        self._cond = threading.Condition()

    def _set(self, key: str, value: bytes) -> None:
        with self._cond:
            self._data[key] = value
            self._cond.notify_all()

    def _get(self, key: str, timeout: float) -> bytes | None:
        with self._cond:
            self._cond.wait_for(lambda: key in self._data or self._closed, timeout)
            return self._data.get(key)

    def _add(self, key: str, amount: int) -> int:
        with self._cond:
            value = apply_add(key, self._data.get(key), amount)
            self._data[key] = str(value).encode()
            self._cond.notify_all()
        return value

    def _compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        with self._cond:
            new, reply = apply_compare_set(self._data.get(key), expected, desired)
            if new is not None:
                self._data[key] = new
                self._cond.notify_all()
        return reply

    def _wait(self, keys: list[str], timeout: float) -> list[str]:
        with self._cond:
            self._cond.wait_for(lambda: self._closed or self._check(keys), timeout)
            return [k for k in keys if k not in self._data]

    def _check(self, keys: list[str]) -> bool:
        with self._cond:
            return all(k in self._data for k in keys)

    def _delete_key(self, key: str) -> bool:
        with self._cond:
            return self._data.pop(key, None) is not None

    def _num_keys(self) -> int:
        with self._cond:
            return len(self._data)

    def _close(self) -> None:
        with self._cond:
            self._cond.notify_all()

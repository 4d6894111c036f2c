"""FileStore: a store shared by processes through one file, locked with ``flock``.

For jobs whose ranks share a filesystem (``init_method="file://..."``). The file
is an append-only log of msgpack records; each process replays it into a private
dict. This module owns the log format and the locking; it knows nothing of
torch's own FileStore format (the two do not share files).

Records (msgpack arrays):

* ``[0, key, value]`` — set ``key`` to ``value`` (bytes);
* ``[1, key]`` — delete ``key``;
* ``[2, delta]`` — a user opened (+1) or closed (-1) the store; counted so that,
  like torch, the last of ``world_size`` users removes the file. These are not
  keys and do not count in ``num_keys``.

Invariants:

* Every append happens under ``LOCK_EX`` after replaying the log up to its end,
  so a read-modify-write (``add``, ``compare_set``) sees the latest value and no
  other writer can interleave. Reads replay under ``LOCK_SH``.
* ``flock`` excludes other open files, not threads sharing this one, so every
  use of the descriptor also holds ``_lock`` (a threading lock). Neither lock is
  held while sleeping.
* There is no change notification: ``get`` and ``wait`` poll, sleeping 1 ms at
  first and doubling up to 50 ms, until the deadline.

Limitation: the log is never compacted; it grows with every write. A rendezvous
writes a few records per rank, so this is cheap for its purpose, but a FileStore
is not a database for a hot counter.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import msgpack

from ..errors import ClosedError, InvalidArgumentError, StoreError
from .store import Store
from .store_rules import apply_add, apply_compare_set

__all__ = ["FileStore"]

_SET, _DELETE, _USERS = 0, 1, 2

_POLL_FIRST = 0.001  # seconds; a key set by a process on the same host shows up fast
_POLL_MAX = 0.05  # seconds; bounds the latency added to a rendezvous step


class FileStore(Store):
    """A store in the file ``file_name``, shared by every process that opens it.

    Args:
        file_name: path of the file; created if missing.
        world_size: number of users that will open the file. When positive, the
            file is removed when the last of them closes the store; ``-1`` keeps it.

    Raises:
        StoreError: the file cannot be opened, locked, read or written.
    """

    def __init__(self, file_name: str, world_size: int = -1) -> None:
        if not isinstance(file_name, (str, os.PathLike)) or not os.fspath(file_name):
            raise InvalidArgumentError(f"FileStore needs a file name, got {file_name!r}")
        super().__init__()
        self._path = os.fspath(file_name)
        self._world_size = int(world_size)
        self._lock = threading.Lock()
        self._data: dict[str, bytes] = {}
        self._offset = 0  # bytes of the log replayed into _data
        self._users = 0  # users that have the file open now
        self._leaves = 0  # users that have closed it
        try:
            self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            raise StoreError(f"FileStore: cannot open {self._path!r}: {exc.strerror}") from exc
        try:
            with self._locked(exclusive=True):
                self._append([_USERS, 1])
        except BaseException:
            os.close(self._fd)
            raise

    @property
    def path(self) -> str:
        """The file's path."""
        return self._path

    # -- the log ----------------------------------------------------------

    @contextmanager
    def _locked(self, exclusive: bool) -> Iterator[None]:
        """Hold the thread lock and the file lock, with ``_data`` caught up."""
        with self._lock:
            if self._closed:  # checked under _lock: _close closes the descriptor under it
                raise ClosedError(f"FileStore: the store on {self._path!r} is closed")
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
                try:
                    self._replay()
                    yield
                finally:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
            except OSError as exc:
                raise StoreError(f"FileStore: I/O error on {self._path!r}: {exc}") from exc

    def _replay(self) -> None:
        size = os.fstat(self._fd).st_size
        if size <= self._offset:
            return
        chunks = []
        offset = self._offset
        while offset < size:
            chunk = os.pread(self._fd, size - offset, offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
        data = b"".join(chunks)
        unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(len(data), 1))
        unpacker.feed(data)
        try:
            for record in unpacker:
                self._apply(record)
        except (ValueError, TypeError, IndexError, msgpack.UnpackException) as exc:
            raise StoreError(
                f"FileStore: {self._path!r} is corrupt at byte {self._offset}: {exc}"
            ) from exc
        self._offset += unpacker.tell()

    def _apply(self, record: list) -> None:
        kind = record[0]
        if kind == _SET:
            self._data[record[1]] = record[2]
        elif kind == _DELETE:
            self._data.pop(record[1], None)
        elif kind == _USERS:
            self._users += record[1]
            self._leaves += record[1] < 0
        else:
            raise ValueError(f"unknown record kind {kind!r}")

    def _append(self, record: list) -> None:
        """Write ``record`` at the end of the log (``LOCK_EX`` held, log replayed)."""
        blob = msgpack.packb(record, use_bin_type=True)
        written = os.write(self._fd, blob)  # O_APPEND: at the end, in one write
        if written != len(blob):
            raise OSError(f"short write ({written} of {len(blob)} bytes)")
        self._offset += written
        self._apply(record)

    def _poll(self, done: Callable[[], bool], timeout: float) -> None:
        """Replay the log until ``done()`` (called with the lock held) or the deadline."""
        deadline = time.monotonic() + timeout
        delay = _POLL_FIRST
        while True:
            with self._locked(exclusive=False):
                if done():
                    return
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._closed:
                return
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, _POLL_MAX)

    # -- Store hooks ------------------------------------------------------

    def _set(self, key: str, value: bytes) -> None:
        with self._locked(exclusive=True):
            self._append([_SET, key, value])

    def _get(self, key: str, timeout: float) -> bytes | None:
        self._poll(lambda: key in self._data, timeout)
        with self._lock:
            return self._data.get(key)

    def _add(self, key: str, amount: int) -> int:
        with self._locked(exclusive=True):
            value = apply_add(key, self._data.get(key), amount)
            self._append([_SET, key, str(value).encode()])
        return value

    def _compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        with self._locked(exclusive=True):
            new, reply = apply_compare_set(self._data.get(key), expected, desired)
            if new is not None:
                self._append([_SET, key, new])
        return reply

    def _wait(self, keys: list[str], timeout: float) -> list[str]:
        self._poll(lambda: all(k in self._data for k in keys), timeout)
        with self._lock:
            return [k for k in keys if k not in self._data]

    def _check(self, keys: list[str]) -> bool:
        with self._locked(exclusive=False):
            return all(k in self._data for k in keys)

    def _delete_key(self, key: str) -> bool:
        with self._locked(exclusive=True):
            existed = key in self._data
            if existed:
                self._append([_DELETE, key])
        return existed

    def _num_keys(self) -> int:
        with self._locked(exclusive=False):
            return len(self._data)

    def _close(self) -> None:
        # _locked refuses once closed, so take the locks by hand for the last write.
        with self._lock:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX)
                self._replay()
                self._append([_USERS, -1])
                if self._world_size > 0 and self._users <= 0 and self._leaves >= self._world_size:
                    # Best effort, as torch: another process may have removed it.
                    try:
                        os.unlink(self._path)
                    except FileNotFoundError:
                        pass
            except OSError as exc:
                raise StoreError(f"FileStore: cannot close {self._path!r}: {exc}") from exc
            finally:
                os.close(self._fd)  # also releases the flock

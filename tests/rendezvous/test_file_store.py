"""FileStore: what the file itself does (semantics shared with the other stores
are in test_stores.py)."""

from __future__ import annotations

import io

import msgpack
import pytest

from asyncdist.errors import StoreError
from asyncdist.rendezvous.file_store import FileStore


def test_last_of_world_size_users_removes_the_file(tmp_path) -> None:
    path = tmp_path / "store"
    first, second = FileStore(str(path), world_size=2), FileStore(str(path), world_size=2)
    first.set("k", "v")
    first.close()
    assert path.exists()
    assert second.get("k") == b"v"
    assert second.num_keys() == 1  # user bookkeeping is not a key
    second.close()
    assert not path.exists()


def test_file_is_kept_without_world_size(tmp_path) -> None:
    path = tmp_path / "store"
    store = FileStore(str(path))
    store.set("k", "v")
    store.close()
    assert path.exists()
    with FileStore(str(path)) as again:
        assert again.get("k") == b"v"


def test_log_records_are_msgpack(tmp_path) -> None:
    path = tmp_path / "store"
    with FileStore(str(path)) as store:
        store.set("k", b"v")
        store.add("n", 2)
        store.delete_key("k")
    records = list(msgpack.Unpacker(io.BytesIO(path.read_bytes()), raw=False))
    assert records == [[2, 1], [0, "k", b"v"], [0, "n", b"2"], [1, "k"], [2, -1]]


def test_corrupt_file_raises_store_error(tmp_path) -> None:
    path = tmp_path / "store"
    path.write_bytes(msgpack.packb([7, "?"]))
    with pytest.raises(StoreError, match="corrupt"):
        FileStore(str(path))


def test_unopenable_path_raises_store_error(tmp_path) -> None:
    with pytest.raises(StoreError, match="cannot open"):
        FileStore(str(tmp_path / "no" / "such" / "dir"))

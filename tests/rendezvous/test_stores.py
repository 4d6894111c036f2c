"""One body of store semantics, run over every store.

Each test gets two handles on one store (``store`` and ``peer``): the same object
for HashStore, two FileStores on one file, a TCPStore master and a client, two
PrefixStores with one prefix over one HashStore. Whatever one handle writes, the
other must read. Cross-process tests use real spawned processes.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import threading
import time
from datetime import timedelta
from typing import Iterator

import pytest

from asyncdist.errors import ClosedError, InvalidArgumentError, StoreError, StoreTimeoutError
from asyncdist.rendezvous.file_store import FileStore
from asyncdist.rendezvous.hash_store import HashStore
from asyncdist.rendezvous.store import PrefixStore, Store
from asyncdist.rendezvous.store_rules import apply_compare_set, timeout_seconds
from asyncdist.rendezvous.tcp_store import TCPStore

KINDS = ["hash", "file", "tcp", "prefix"]


def _open(kind: str, tmp_path) -> tuple[Store, Store, list[Store]]:
    """Return (store, peer, everything to close) for one kind of store."""
    if kind == "hash":
        store = HashStore()
        return store, store, [store]
    if kind == "file":
        tmp_path.mkdir(parents=True, exist_ok=True)
        path = str(tmp_path / "store")
        store, peer = FileStore(path), FileStore(path)
        return store, peer, [store, peer]
    if kind == "tcp":
        store = TCPStore("127.0.0.1", 0, world_size=2, is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=10))
        peer = TCPStore("127.0.0.1", store.port, world_size=2, timeout=timedelta(seconds=10))
        return store, peer, [peer, store]
    base = HashStore()
    store, peer = PrefixStore("job", base), PrefixStore("job", base)
    return store, peer, [store, peer, base]


@pytest.fixture(params=KINDS)
def stores(request, tmp_path) -> Iterator[tuple[Store, Store]]:
    store, peer, owned = _open(request.param, tmp_path)
    store.set_timeout(timedelta(seconds=10))
    peer.set_timeout(timedelta(seconds=10))
    yield store, peer
    for s in owned:
        s.close()


def _in_thread(fn, *args) -> tuple[threading.Thread, dict]:
    """Run fn(*args) in a thread; the dict gets "value" or "error"."""
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn(*args)
        except BaseException as exc:  # reported to the test through out
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


# -- pure helpers ----------------------------------------------------------


def test_timeout_seconds() -> None:
    assert timeout_seconds(None, 7.0) == 7.0
    assert timeout_seconds(timedelta(milliseconds=1500), 7.0) == 1.5
    assert timeout_seconds(2, 7.0) == 2.0
    assert timeout_seconds(timedelta.max, 7.0) == timeout_seconds(float("inf"), 7.0) > 3e7
    for bad in (-1, timedelta(seconds=-1), float("nan"), "3", True):
        with pytest.raises(InvalidArgumentError):
            timeout_seconds(bad, 7.0)


def test_compare_set_rule_all_branches() -> None:
    assert apply_compare_set(None, b"", b"d") == (b"d", b"d")  # missing, expected empty
    assert apply_compare_set(None, b"e", b"d") == (None, b"e")  # missing: answer expected
    assert apply_compare_set(b"e", b"e", b"d") == (b"d", b"d")  # match
    assert apply_compare_set(b"c", b"e", b"d") == (None, b"c")  # mismatch: answer current
    assert apply_compare_set(b"", b"", b"d") == (b"d", b"d")  # present and empty matches


# -- semantics, every store ------------------------------------------------


def test_set_get_bytes_and_str(stores) -> None:
    store, peer = stores
    store.set("s", "héllo")
    store.set("b", b"\x00\xff\x80")
    assert peer.get("s") == "héllo".encode()
    assert peer.get("b") == b"\x00\xff\x80"
    peer.set("s", b"")
    assert store.get("s") == b""
    with pytest.raises(InvalidArgumentError):
        store.set(3, "x")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        store.set("k", 3)  # type: ignore[arg-type]


def test_get_blocks_until_another_thread_sets(stores) -> None:
    store, peer = stores
    thread, out = _in_thread(peer.get, "late")
    thread.join(0.1)
    assert thread.is_alive(), f"get returned before the key was set: {out}"
    store.set("late", b"here")
    thread.join(10)
    assert out == {"value": b"here"}


def test_get_times_out_naming_the_key(stores) -> None:
    store, _ = stores
    store.set_timeout(timedelta(seconds=0.2))
    assert store.timeout == timedelta(seconds=0.2)
    start = time.monotonic()
    with pytest.raises(StoreTimeoutError, match=r"missing'.*0\.2 s"):
        store.get("missing")
    assert 0.18 <= time.monotonic() - start < 3


def test_add_counts_in_ascii_decimal(stores) -> None:
    store, peer = stores
    assert store.add("n", 3) == 3
    assert peer.get("n") == b"3"
    assert peer.add("n", -5) == -2
    assert store.get("n") == b"-2"
    store.set("n", " 12 apples")  # read as C's stoll reads it, as torch does
    assert store.add("n", 1) == 13
    store.set("text", "abc")
    with pytest.raises(InvalidArgumentError, match="text'"):
        store.add("text", 1)
    with pytest.raises(InvalidArgumentError):
        store.add("n", 1.5)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="int64"):
        store.add("n", 2**63 - 1)  # 13 + that overflows
    with pytest.raises(InvalidArgumentError, match="int64"):
        store.add("n", 2**64)
    assert store.get("n") == b"13"


def test_concurrent_adds_sum(stores) -> None:
    store, peer = stores
    threads = [_in_thread(lambda s=s: [s.add("ctr", i) for i in range(1, 31)])
               for s in (store, peer) * 3]
    for thread, out in threads:
        thread.join(30)
        assert "error" not in out, out
    assert int(store.get("ctr")) == 6 * sum(range(1, 31))


def test_compare_set_branches(stores) -> None:
    store, peer = stores
    assert store.compare_set("k", "x", "v") == b"x"  # missing, expected not empty
    assert not peer.check(["k"])
    assert store.compare_set("k", "", "v") == b"v"  # missing, expected empty: set
    assert peer.get("k") == b"v"
    assert peer.compare_set("k", "wrong", "w") == b"v"  # mismatch: current, unchanged
    assert store.get("k") == b"v"
    assert peer.compare_set("k", b"v", b"w") == b"w"  # match: set
    assert store.get("k") == b"w"


def test_wait_check_delete_num_keys(stores) -> None:
    store, peer = stores
    assert store.check([])
    assert store.num_keys() == 0
    store.set("a", "1")
    assert peer.check(["a"]) and not peer.check(["a", "b"])
    start = time.monotonic()
    with pytest.raises(StoreTimeoutError, match=r"\['(job/)?b'\]") as info:
        peer.wait(["a", "b"], timedelta(seconds=0.2))
    assert "'a'" not in str(info.value)
    assert 0.18 <= time.monotonic() - start < 3
    thread, out = _in_thread(peer.wait, ["a", "b", "c"], 10.0)
    store.set("b", "2")
    thread.join(0.1)
    assert thread.is_alive(), "wait returned with 'c' missing"
    store.set("c", "3")
    thread.join(10)
    assert out == {"value": None}
    assert store.num_keys() == 3
    assert peer.delete_key("b") is True
    assert store.delete_key("b") is False
    assert not store.check(["b"])
    assert store.num_keys() == 2


async def test_async_twins_many_waiters_in_one_loop(stores) -> None:
    store, peer = stores
    keys = [f"rank{i}" for i in range(16)]
    # More waiters than the loop's default executor has threads on this machine.
    getters = [asyncio.ensure_future(peer.async_get(k)) for k in keys]
    waiter = asyncio.ensure_future(store.async_wait(keys, timedelta(seconds=10)))
    await asyncio.sleep(0)  # let them start; correctness does not depend on it
    for i, k in enumerate(keys):
        await store.async_set(k, str(i))
    assert await asyncio.gather(*getters) == [str(i).encode() for i in range(16)]
    await waiter
    counts = await asyncio.gather(*(s.async_add("n", 1) for s in (store, peer) * 8))
    assert sorted(counts) == list(range(1, 17))
    assert await peer.async_compare_set("n", "16", "done") == b"done"
    assert await store.async_check(keys + ["n"])
    assert await store.async_num_keys() == 17
    assert await peer.async_delete_key("n") is True
    with pytest.raises(StoreTimeoutError):
        await store.async_wait(["nope"], 0.1)


def test_close_is_idempotent_then_closed_error(tmp_path) -> None:
    for kind in KINDS:
        store, _, owned = _open(kind, tmp_path / kind)
        store.set("k", "v")
        for s in owned:
            s.close()
            s.close()
        for call in (lambda: store.set("k", "v"), lambda: store.get("k"),
                     lambda: store.add("k", 1), lambda: store.check(["k"]),
                     lambda: store.wait(["k"]), lambda: store.num_keys(),
                     lambda: store.delete_key("k"), lambda: store.compare_set("k", "", "v")):
            with pytest.raises(ClosedError):
                call()


@pytest.mark.parametrize("kind", ["hash", "file", "tcp"])
def test_close_wakes_a_blocked_get(kind, tmp_path) -> None:
    store, peer, owned = _open(kind, tmp_path)
    peer.set_timeout(timedelta(seconds=30))
    thread, out = _in_thread(peer.get, "never")
    thread.join(0.1)
    assert thread.is_alive()
    start = time.monotonic()
    for s in owned:
        s.close()
    thread.join(10)
    assert time.monotonic() - start < 5
    assert isinstance(out.get("error"), (ClosedError, StoreError)), out


def test_context_manager_closes(tmp_path) -> None:
    with FileStore(str(tmp_path / "f")) as store:
        store.set("k", "v")
    with pytest.raises(ClosedError):
        store.get("k")


def test_prefix_store_namespaces_keys() -> None:
    base = HashStore()
    outer = PrefixStore("a", PrefixStore("b", base))
    outer.set("k", "v")
    assert base.get("b/a/k") == b"v"
    assert outer.underlying_store.underlying_store is base  # type: ignore[attr-defined]
    outer.set_timeout(1.5)
    assert base.timeout == timedelta(seconds=1.5)
    outer.close()
    assert base.get("b/a/k") == b"v"  # the underlying store stays open


# -- torch as the reference ------------------------------------------------


def test_semantics_match_torch_hash_store(tmp_path) -> None:
    dist = pytest.importorskip("torch.distributed")
    rng = random.Random(1234)
    keys = ["a", "b", "c"]
    values = ["", "0", "1", "x", "12", " -7", "3x"]
    ops = []
    for _ in range(300):
        kind = rng.choice(["set", "add", "compare_set", "get", "check", "delete_key"])
        ops.append((kind, rng.choice(keys), rng.choice(values), rng.choice(values),
                    rng.randint(-3, 3)))

    def run(store) -> list:
        results = []
        for kind, key, v1, v2, n in ops:
            try:
                if kind == "set":
                    results.append(store.set(key, v1))
                elif kind == "add":
                    results.append(store.add(key, n))
                elif kind == "compare_set":
                    results.append(store.compare_set(key, v1, v2))
                elif kind == "get":
                    results.append(store.get(key) if store.check([key]) else "missing")
                elif kind == "check":
                    results.append(store.check([key]))
                else:
                    results.append(store.delete_key(key))
            except ValueError:  # add on a non-integer: torch ValueError, ours too
                results.append("ValueError")
            results.append(store.num_keys())
        return results

    expected = run(dist.HashStore())
    assert "ValueError" in expected and b"" in expected  # the sequence hits the edges
    for kind in KINDS:
        store, _, owned = _open(kind, tmp_path / kind)
        try:
            assert run(store) == expected, kind
        finally:
            for s in owned:
                s.close()


# -- separate processes ----------------------------------------------------


def _add_worker(kind: str, where: str, rounds: int) -> None:
    store: Store
    if kind == "file":
        store = FileStore(where)
    else:
        store = TCPStore("127.0.0.1", int(where), timeout=timedelta(seconds=30))
    for i in range(rounds):
        store.add("total", i)
    store.set(f"done/{multiprocessing.current_process().name}", "1")
    store.close()


@pytest.mark.parametrize("kind", ["file", "tcp"])
def test_processes_add_concurrently(kind, tmp_path) -> None:
    if kind == "file":
        store: Store = FileStore(str(tmp_path / "shared"))
        where = str(tmp_path / "shared")
    else:
        store = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30))
        where = str(store.port)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_add_worker, args=(kind, where, 100), name=f"w{i}")
             for i in range(3)]
    try:
        for p in procs:
            p.start()
        for i in range(100):  # this process adds too
            store.add("total", i)
        store.wait([f"done/w{i}" for i in range(3)], timedelta(seconds=60))
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
        assert store.get("total") == str(4 * sum(range(100))).encode()
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        store.close()

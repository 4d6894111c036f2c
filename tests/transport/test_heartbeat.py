"""The heartbeat: pings on idle streams, silent peers declared lost."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from asyncdist import init_world
from asyncdist.errors import InvalidArgumentError, PeerLostError
from asyncdist.rendezvous.hash_store import HashStore
from asyncdist.testing import local_world
from asyncdist.transport.heartbeat import INTERVAL_ENV, TIMEOUT_ENV, Heartbeat, HeartbeatConfig
from asyncdist.wire.control import Ping, decode_control
from asyncdist.wire.frames import decode_header

# -- configuration ---------------------------------------------------------------


def test_defaults_and_environment() -> None:
    assert HeartbeatConfig.from_env({}) == HeartbeatConfig(5.0, 30.0)
    assert HeartbeatConfig.from_env({INTERVAL_ENV: "0.5", TIMEOUT_ENV: " 3 "}) == HeartbeatConfig(0.5, 3.0)
    assert not HeartbeatConfig.from_env({INTERVAL_ENV: "0"}).enabled  # 0 turns it off
    assert HeartbeatConfig(1.0, 0).enabled  # pings only, nobody declared lost


@pytest.mark.parametrize("environ, message", [
    ({INTERVAL_ENV: "soon"}, f"{INTERVAL_ENV} must be a number of seconds"),
    ({TIMEOUT_ENV: "-1"}, "timeout must be a finite number"),
    ({INTERVAL_ENV: "inf"}, "interval must be a finite number"),
    ({INTERVAL_ENV: "5", TIMEOUT_ENV: "8"}, "at least twice the interval"),
])
def test_bad_settings_are_refused_naming_the_variable(environ, message) -> None:
    with pytest.raises(InvalidArgumentError, match=message) as info:
        HeartbeatConfig.from_env(environ)
    assert INTERVAL_ENV in str(info.value)


def test_bad_keyword_values_are_refused() -> None:
    with pytest.raises(InvalidArgumentError):
        HeartbeatConfig(True, 30)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="at least twice"):
        HeartbeatConfig(1.0, 1.5)


# -- one check, with fake connections and a fake clock ----------------------------


class FakeConnection:
    def __init__(self, last_sent: float, last_received: float) -> None:
        self.last_sent, self.last_received = last_sent, last_received
        self.frames: list[bytes] = []

    def send_frame(self, header: bytes, payload) -> None:
        self.frames.append(header)


def _heartbeat(connections, lost) -> Heartbeat:
    beat = Heartbeat(7, HeartbeatConfig(1.0, 4.0), connections, lambda rank, error: lost.append((rank, error)))
    beat._last_tick = 100.0
    return beat


def test_one_check_pings_idle_streams_and_drops_silent_peers() -> None:
    lost: list = []
    busy, idle, silent = FakeConnection(99.8, 99.9), FakeConnection(98.9, 99.9), FakeConnection(99.0, 96.0)
    connections = {1: busy, 2: idle, 3: silent}
    _heartbeat(connections, lost).beat(100.4)
    assert busy.frames == []
    (ping,) = idle.frames
    assert decode_control(decode_header(ping[4:])) == Ping(7)
    ((rank, error),) = lost
    assert rank == 3 and isinstance(error, PeerLostError) and error.rank == 3
    assert str(error).startswith("rank 3 sent nothing for 4.4 s (heartbeat timeout 4 s)")


def test_a_late_check_declares_nobody_lost() -> None:
    # The loop was held for 10 s: the peer's bytes may be unread in the kernel.
    lost: list = []
    silent = FakeConnection(90.0, 90.0)
    beat = _heartbeat({3: silent}, lost)
    beat.beat(110.0)
    assert lost == [] and len(silent.frames) == 1
    beat.beat(110.5)  # on time now, and still nothing arrived
    assert [rank for rank, _ in lost] == [3]


# -- real ranks in one loop ---------------------------------------------------


@pytest.fixture
def fast_heartbeat(monkeypatch) -> HeartbeatConfig:
    monkeypatch.setenv(INTERVAL_ENV, "0.1")
    monkeypatch.setenv(TIMEOUT_ENV, "0.6")
    return HeartbeatConfig(0.1, 0.6)


async def test_idle_peers_are_kept_alive_by_pings(fast_heartbeat, virtual_clock) -> None:
    async with local_world(3) as ranks:
        connection = ranks[0].engine._connections[1]
        before = connection.last_received
        await asyncio.sleep(2.5 * fast_heartbeat.timeout)  # nobody sends anything but pings
        assert connection.last_received > before
        x = [np.full(2, float(g.rank)) for g in ranks]
        await asyncio.gather(*(g.all_reduce(v) for g, v in zip(ranks, x)))
        assert all(v.tolist() == [3.0, 3.0] for v in x)


async def test_a_silent_peer_is_lost_and_the_others_carry_on(fast_heartbeat, virtual_clock) -> None:
    async with local_world(3) as (a, b, c):
        # Rank 2 hangs: it sends nothing more (no pings) and reads nothing.
        await c.engine._heartbeat.stop()
        loop = asyncio.get_running_loop()
        loop.remove_reader(c.engine._connections[0]._fd)
        waiting = a.irecv(np.zeros(1), 2)
        stuck = a.isend(np.ones(4 << 20), 2)  # 32 MiB that nobody reads
        start = loop.time()
        with pytest.raises(PeerLostError, match="rank 2 sent nothing for") as info:
            await waiting
        took = loop.time() - start
        assert info.value.rank == 2
        assert took < fast_heartbeat.timeout + fast_heartbeat.interval + 0.5
        with pytest.raises(PeerLostError, match="rank 2 sent nothing for"):
            await stuck  # the pending send fails with the same error
        got = np.zeros(1)
        await asyncio.gather(a.send(np.full(1, 5.0), 1), b.recv(got, 0))
        assert got[0] == 5.0
        pair = [g.new_group([0, 1]) for g in (a, b, c)]
        x, y = np.ones(1), np.ones(1)
        await asyncio.gather(pair[0].all_reduce(x), pair[1].all_reduce(y))
        assert x[0] == y[0] == 2.0


async def test_the_keyword_wins_and_zero_turns_it_off(monkeypatch) -> None:
    monkeypatch.setenv(INTERVAL_ENV, "0.1")
    monkeypatch.setenv(TIMEOUT_ENV, "0.6")
    off = HeartbeatConfig(0, 0)
    store = HashStore()
    worlds = await asyncio.gather(*(init_world(store=store, rank=r, world_size=2, timeout=10, heartbeat=off)
                                    for r in range(2)))
    try:
        for world in worlds:
            assert world.engine._heartbeat.config == off and world.engine._heartbeat._task is None
    finally:
        await asyncio.gather(*(w.close() for w in worlds))
        store.close()


async def test_a_bad_setting_fails_init_at_once(monkeypatch) -> None:
    monkeypatch.setenv(INTERVAL_ENV, "often")
    store = HashStore()
    start = time.monotonic()
    with pytest.raises(InvalidArgumentError, match=INTERVAL_ENV):
        await init_world(store=store, rank=0, world_size=2, timeout=30)
    assert time.monotonic() - start < 1
    assert store.num_keys() == 0  # refused before the rendezvous began
    store.close()

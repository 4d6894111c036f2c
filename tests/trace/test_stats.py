"""``group.stats()``: bytes, messages and operations, checked against known traffic."""

from __future__ import annotations

import asyncio

import numpy as np

from asyncdist.testing import local_world


async def test_stats_count_known_traffic_and_reset() -> None:
    async with local_world(2) as ranks:
        a, b = ranks
        for group in ranks:
            group.stats(reset=True)
        for i in range(3):
            out = np.zeros(100, np.float32)
            await asyncio.gather(a.send(np.full(100, i, np.float32), dst=1), b.recv(out, src=0))
            np.testing.assert_array_equal(out, np.full(100, i, np.float32))
        sender, receiver = a.stats(), b.stats(reset=True)

        assert sender["peers"][1] | {"same_host": None} == {
            "sent_bytes": 1200, "sent_messages": 3, "received_bytes": 0, "received_messages": 0, "same_host": None}
        assert receiver["peers"][0] | {"same_host": None} == {
            "sent_bytes": 0, "sent_messages": 0, "received_bytes": 1200, "received_messages": 3, "same_host": None}
        assert sender["same_host_bytes"] + sender["socket_bytes"] == 1200
        assert sender["ops"].keys() == {"send"} and sender["ops"]["send"]["count"] == 3
        assert receiver["ops"].keys() == {"recv"} and receiver["ops"]["recv"]["count"] == 3
        assert receiver["wait_seconds"] == receiver["ops"]["recv"]["seconds"] > 0

        after = b.stats()  # reset above
        assert after["peers"][0]["received_bytes"] == 0 and after["ops"] == {}
        x = [np.ones(4), np.ones(4)]
        await asyncio.gather(a.all_reduce(x[0]), b.all_reduce(x[1]))
        assert b.stats()["ops"]["all_reduce"]["count"] == 1

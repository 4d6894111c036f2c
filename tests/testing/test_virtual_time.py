"""Virtual time for ranks in one loop: timers cost no real time, bytes still cross real sockets."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from asyncdist.errors import InvalidArgumentError, OperationTimeoutError
from asyncdist.testing import is_virtual, local_world, virtual_time

on_asyncio = pytest.mark.asyncio(loop_factories=["asyncio"])


@on_asyncio
async def test_a_timeout_passes_in_virtual_time_and_the_ranks_go_on() -> None:
    loop = asyncio.get_running_loop()
    async with local_world(3, timeout=45.0, virtual_time=True) as ranks:
        assert is_virtual()
        began, wall = loop.time(), time.monotonic()
        with pytest.raises(OperationTimeoutError, match=r"rank 0: recv from rank 2 .* after 45 s"):
            await ranks[0].recv(np.zeros(2), src=2)
        waited, wall_waited = loop.time() - began, time.monotonic() - wall
        # The loop's clock moved by the timeout; the wall clock by a fraction of it.
        assert 45.0 <= waited < 46.0
        assert wall_waited < waited / 3
        arrays = [np.full(4, float(g.rank + 1)) for g in ranks]
        await asyncio.gather(*(g.all_reduce(a) for g, a in zip(ranks, arrays)))
        assert [a.tolist() for a in arrays] == [[6.0] * 4] * 3
    assert not is_virtual()


@on_asyncio
async def test_the_clock_never_goes_back_across_blocks_and_nested_blocks() -> None:
    loop = asyncio.get_running_loop()
    readings = [loop.time()]
    with virtual_time():
        await asyncio.sleep(100)
        readings.append(loop.time())
        with virtual_time():  # already virtual: changes nothing
            await asyncio.sleep(50)
            readings.append(loop.time())
    readings.append(loop.time())  # the wall clock again, behind what was skipped
    with virtual_time():  # carries on from the virtual clock, not back to the wall
        readings.append(loop.time())
        await asyncio.sleep(10)
        readings.append(loop.time())
    assert readings[1] - readings[0] >= 100 and readings[2] - readings[1] >= 50
    assert readings[4] >= readings[2] and readings[5] - readings[4] >= 10
    assert readings[3] < readings[2]


@pytest.mark.asyncio(loop_factories=["uvloop"])
async def test_uvloop_is_refused_naming_its_loop() -> None:
    with pytest.raises(InvalidArgumentError, match=r"asyncio's own event loop; the clock of uvloop"):
        async with local_world(2, virtual_time=True):
            pass

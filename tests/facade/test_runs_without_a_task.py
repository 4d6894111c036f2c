"""A blocking call runs its coroutine without an asyncio Task (asyncdist.loop.turns),
so nothing the facade runs may need one: ``asyncio.timeout`` does, and from
Python 3.12 so does ``asyncio.wait_for``, which is built on it.

On Python 3.12 every facade script failed at ``destroy_process_group()``
("RuntimeError: Timeout should be used inside a task") while CI, on 3.11,
passed. Here each rank gives ``asyncio.wait_for`` 3.12's rule before it
starts, on any Python, and runs the calls that waited with it: the group's
close with peers to say goodbye to, and a barrier with a timeout.
"""

from __future__ import annotations

import asyncio

import numpy as np

from asyncdist.testing import spawn


def _rank_under_312_rules() -> list[float]:
    import asyncdist as dist

    original = asyncio.wait_for

    async def wait_for_needing_a_task(aw, timeout):  # type: ignore[no-untyped-def]
        if asyncio.current_task() is None:
            raise RuntimeError("Timeout should be used inside a task")  # Python 3.12's words
        return await original(aw, timeout)

    asyncio.wait_for = wait_for_needing_a_task  # type: ignore[assignment]
    dist.init_process_group()
    x = np.full(3, dist.get_rank() + 1.0)
    dist.all_reduce(x)
    dist.barrier(timeout=30)
    dist.destroy_process_group()
    return x.tolist()


def test_barrier_with_timeout_and_destroy_need_no_task() -> None:
    results = spawn(3, _rank_under_312_rules, timeout=60)
    assert results == [[6.0, 6.0, 6.0]] * 3

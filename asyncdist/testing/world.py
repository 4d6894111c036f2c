"""``local_world``: n ranks in the current event loop, over real loopback sockets.

Every rank is a full :class:`~asyncdist.group.process_group.ProcessGroup` with its own
engine and its own authenticated TCP connections; only the process is shared.
This makes multi-rank tests of the await API fast and deterministic, and lets
one test drive all ranks with ``asyncio.gather``.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from typing import AsyncIterator

from ..group.process_group import ProcessGroup
from ..rendezvous.hash_store import HashStore
from ..group.world import init_world
from .faults import FaultPlan
from .injector import install, installed, note_plan, uninstall
from .virtual_time import virtual_time as _virtual_time

__all__ = ["local_world", "crash"]


@contextlib.asynccontextmanager
async def local_world(
    n: int, *, timeout: timedelta | float = 60.0, faults: FaultPlan | str | None = None,
    virtual_time: bool = False,
) -> AsyncIterator[list[ProcessGroup]]:
    """Start ``n`` ranks in this loop; yield their world groups, indexed by rank.

    Every group is closed on exit, also when the body raises. ``faults``: a
    fault plan (:mod:`asyncdist.testing.faults`) installed from before the
    ranks connect until they are closed; an error out of the body then notes it.
    With ``virtual_time``, the loop runs on :func:`~asyncdist.testing.virtual_time`
    from the rendezvous to the last close: timeouts, heartbeats, hang warnings
    and a plan's delays and pauses cost no real time (asyncio's own loop only).

    Example::

        async with local_world(4) as ranks:
            await asyncio.gather(*(g.barrier() for g in ranks))
    """
    with _virtual_time() if virtual_time else contextlib.nullcontext():
        async with _ranks(n, timeout, FaultPlan.of(faults)) as ranks:
            yield ranks


@contextlib.asynccontextmanager
async def _ranks(n: int, timeout: timedelta | float, plan: FaultPlan) -> AsyncIterator[list[ProcessGroup]]:
    injector = install(plan) if plan else None
    store = HashStore()
    worlds: list[ProcessGroup] = []
    try:
        results = await asyncio.gather(
            *(init_world(store=store, rank=r, world_size=n, timeout=timeout, group_name=f"local{n}") for r in range(n)),
            return_exceptions=True,
        )
        worlds = [r for r in results if isinstance(r, ProcessGroup)]
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]
        yield worlds
    except BaseException as exc:
        if injector is not None:
            note_plan(exc, plan)
        raise
    finally:
        if (active := installed()) is not None:
            active.heal()  # nothing held back while the ranks say goodbye (also the pytest plugin's plan)
        await asyncio.gather(*(w.close() for w in worlds), return_exceptions=True)
        store.close()
        if injector is not None:
            uninstall()


def crash(group: ProcessGroup) -> None:
    """Make ``group``'s rank die as under SIGKILL: every connection of its
    engine is reset at once, with no goodbye, and what it waits on fails.

    For fault-injection tests in one loop; cancel the rank's tasks too, as
    the kernel would stop them. The other ranks see what they would see of
    a killed process: streams reset, with no BYE.
    """
    group.engine.faults.crash()

"""Node 0's launcher says which workers have not joined the rendezvous yet.

Every worker logs whom it waits for (:mod:`asyncdist.rendezvous.waiting`),
but behind its own prefix, among the lines of all the others. Node 0's
launcher serves asyncdist's store, where every rank claims its place, so it
can give the one summary a user needs when a node or a worker never came:
after 10 s, then every ``ASYNCDIST_INIT_REPORT_EVERY`` seconds (``0``: never)::

    asyncdist-run: waiting for ranks [2, 3] of 4 (on node 1) to join the rendezvous (10 s so far)

It speaks only once some rank has claimed its place and until every rank
has: torch scripts (gloo) gather in torch's store instead, where nothing is
claimed, and a launcher that cannot tell stays silent rather than blame
every rank.
"""

from __future__ import annotations

import asyncio
import sys

from ..rendezvous.store import Store
from ..rendezvous.waiting import FIRST_REPORT_SECONDS, duration, ranks_named, report_every

__all__ = ["missing_ranks", "report_gathering", "rendezvous_prefixes"]

#: Where asyncdist's rendezvous keeps its keys in an attempt's store: the
#: facade's first ``init_process_group`` and the await API's ``init_world``.
_PREFIXES = ("asyncdist/0", "asyncdist")


def rendezvous_prefixes(attempt: int) -> list[str]:
    """The key prefixes of ``attempt``'s rendezvous in the launcher's store,
    one per way a worker may start it (the ranks' and their joiners' keys)."""
    return [f"/worker/attempt_{attempt}/{prefix}" for prefix in _PREFIXES]


def missing_ranks(store: Store, attempt: int, world_size: int) -> list[int] | None:
    """The ranks that have not claimed their place in ``attempt``'s rendezvous
    (blocking): [] while none has claimed one, None once every rank has joined."""
    prefixes = rendezvous_prefixes(attempt)
    if any(store.check([f"{prefix}/joined"]) for prefix in prefixes):
        return None
    missing = [r for r in range(world_size)
               if not any(store.check([f"{prefix}/rank/{r}/owner"]) for prefix in prefixes)]
    return [] if len(missing) == world_size else missing


async def report_gathering(store: Store, attempt: int, world_size: int, nproc_per_node: int) -> None:
    """Print, on stderr, the ranks of ``attempt`` still missing from the
    rendezvous, in the workers' report rhythm, until every rank has joined
    (cancel it when the attempt ends first)."""
    every = report_every()
    if not every:
        return
    loop = asyncio.get_running_loop()
    start = loop.time()
    due = start + min(FIRST_REPORT_SECONDS, every)
    while True:
        await asyncio.sleep(max(due - loop.time(), 0.0))
        missing = await asyncio.to_thread(missing_ranks, store, attempt, world_size)
        if missing is None:
            return
        if missing:
            nodes = ranks_named(sorted({rank // nproc_per_node for rank in missing}), "node")
            print(f"asyncdist-run: waiting for {ranks_named(missing)} of {world_size} (on {nodes}) to join the "
                  f"rendezvous ({duration(loop.time() - start)} so far)", file=sys.stderr, flush=True)
        due = loop.time() + every

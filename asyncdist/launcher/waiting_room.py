"""Replacements that no grow can admit any more are told so.

Under ``--on-failure continue --replace N`` a replacement waits in the job's
store until the ranks call ``grow_group()``. If the ranks finish (or all die)
first, no grow will come. Only the launcher sees that: the ranks cannot
tell a replacement they never met. So once every worker it started as a
rank of the job has exited while replacements still run, the launcher
closes the waiting room (:func:`asyncdist.rendezvous.joins.close`) under each
prefix a worker may have used, and each waiting replacement raises
``JoinClosedError`` within about a second, instead of waiting out its
timeout (30 minutes by default), and exits. The summary then lists it as
never admitted: the job's own result does not depend on it.

A replacement once admitted is a rank of the job, but the launcher cannot
tell which replacements were admitted: it closes the room when the workers
it started as ranks are gone, so a replacement admitted earlier can admit
no later one after that. On several nodes a launcher sees only its own
node's workers, so it closes nothing there.
"""

from __future__ import annotations

import asyncio

from ..rendezvous import joins
from ..rendezvous.store import PrefixStore, Store
from .gathering import rendezvous_prefixes
from .workers import Worker

__all__ = ["still_waiting", "close"]

_REASON = "asyncdist-run: every rank of the job has exited"


def still_waiting(workers: list[Worker]) -> list[Worker]:
    """The replacements that no grow can admit any more: every one still
    running, once every worker started as a rank has exited ([] before)."""
    if any(not w.replacement and not w.protocol.exited.done() for w in workers):
        return []
    return [w for w in workers if w.replacement and not w.protocol.exited.done()]


async def close(store: Store, attempt: int) -> None:
    """Close ``attempt``'s waiting room: a replacement still waiting to join
    raises ``JoinClosedError`` (loop thread). A replacement already admitted
    no longer looks at it: the launcher closes it without knowing which.

    Raises:
        StoreError: the launcher's own store failed.
    """
    def close_all() -> None:
        for prefix in rendezvous_prefixes(attempt):
            joins.close(PrefixStore(prefix, store), _REASON)

    await asyncio.to_thread(close_all)

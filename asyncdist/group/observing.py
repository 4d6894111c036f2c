"""A group's view of the engine's flight recorder and counters.

``ProcessGroup.dump_trace()`` writes this rank's record (every group's
operations: a hang often spans groups); ``ProcessGroup.stats()`` reads the
counters of the group's members and of its own operations.

Loop thread only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..engine.engine import Engine
from .calls import Calls

__all__ = ["dump_trace", "stats"]


def dump_trace(engine: Engine, path: str | os.PathLike[str] | None = None) -> Path:
    """Write this rank's flight recorder now; return the file's path.

    Args:
        path: a file, or a folder for ``asyncdist-trace-rank<R>.json``
            (None: ``ASYNCDIST_TRACE_DIR``, else a new temporary folder).
    """
    return engine.flight.dumps.write(path)


def stats(calls: Calls, *, reset: bool = False) -> dict[str, Any]:
    """The group's counters (see :meth:`asyncdist.flight.counters.Counters.snapshot`);
    ``reset`` then zeroes every counter of this rank (all groups)."""
    engine = calls.engine
    peers = [rank for rank in calls.members.ranks if rank != engine.rank]
    contexts = (calls.p2p_context, calls.collective_context)
    snapshot = engine.flight.counters.snapshot(peers, contexts, engine.same_host)
    if reset:
        engine.flight.counters.reset()
    return snapshot

"""Whether a rank may spin while it waits, and for how long.

A rank that waits for a small message from a peer on its host gets it
sooner by looking again and again (spinning) than by sleeping until the
kernel wakes it: a wake-up costs tens of microseconds and resumes on a cold
core. MPI libraries poll the same way. But spinning takes a core, and where
the ranks on a host outnumber its cores the peer a rank waits for may need
that very core. So a rank spins only when the launcher says how many ranks
share its host and they fit the cores it may use. Both the blocking facade
(:mod:`asyncdist.loop.turns`) and the shared-memory rings
(:mod:`.ring_link`) follow this one rule.
"""

from __future__ import annotations

import os
from typing import Mapping

__all__ = ["spin_seconds", "SPIN_ENV", "DEFAULT_SPIN_SECONDS"]

#: Microseconds a blocking call spins before it sleeps (0: never spin).
SPIN_ENV = "ASYNCDIST_SPIN_US"
DEFAULT_SPIN_SECONDS = 1e-3


def spin_seconds(environ: Mapping[str, str] = os.environ) -> float:
    """How long a blocking call spins for the data it waits on before it sleeps.

    ``ASYNCDIST_SPIN_US`` if set; else :data:`DEFAULT_SPIN_SECONDS` when the
    launcher says how many ranks run on this host (``LOCAL_WORLD_SIZE``, as
    torchrun and asyncdist-run set it) and they are no more than the cores
    this process may use, and 0 otherwise.
    """
    text = environ.get(SPIN_ENV, "").strip()
    if text:
        try:
            return max(0.0, float(text)) / 1e6
        except ValueError:
            raise ValueError(f"{SPIN_ENV} must be a number of microseconds, got {text!r}") from None
    local_ranks = environ.get("LOCAL_WORLD_SIZE", "").strip()
    if not local_ranks.isdigit():
        return 0.0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return DEFAULT_SPIN_SECONDS if int(local_ranks) <= cores else 0.0

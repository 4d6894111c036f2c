"""Whether a rank may spin while it waits, and for how long.

A rank that waits for a small message from a peer on its host gets it
sooner by looking again and again (spinning) than by sleeping until the
kernel wakes it: a wake-up costs tens of microseconds and resumes on a cold
core. MPI libraries poll the same way. But spinning takes a core, and where
the ranks on a host outnumber its cores the peer a rank waits for may need
that very core. So a rank spins only when the launcher says how many ranks
share its host and they fit the cores it may use. Both the blocking facade
(:mod:`asyncdist.loop.turns`) and the shared-memory rings
(:mod:`.shm_link`) follow this one rule.

A second rule, per thread: only a thread whose caller waits may spin. The
blocking facade's loop thread runs the loop in the background while the
caller computes (a DDP step's backward while its buckets are reduced);
spinning there takes the core, and the GIL, from that computation (a 10M
parameter DDP step was 5 % slower). That thread says so once
(:func:`forbid_spinning_here`), and the rings' poller asks :func:`may_spin`.
"""

from __future__ import annotations

import os
import threading
from typing import Mapping

from .. import settings

__all__ = ["spin_seconds", "may_spin", "forbid_spinning_here", "SPIN_ENV", "DEFAULT_SPIN_SECONDS"]

_here = threading.local()

#: Microseconds a blocking call spins before it sleeps (0: never spin).
SPIN_ENV = settings.name_of("spin")
DEFAULT_SPIN_SECONDS = 1e-3


def spin_seconds(environ: Mapping[str, str] | None = None) -> float:
    """How long a blocking call spins for the data it waits on before it sleeps.

    ``ASYNCDIST_SPIN_US`` if set; else :data:`DEFAULT_SPIN_SECONDS` when the
    launcher says how many ranks run on this host (``LOCAL_WORLD_SIZE``, as
    torchrun and asyncdist-run set it) and they are no more than the cores
    this process may use, and 0 otherwise.
    """
    read = settings.current() if environ is None else settings.Settings.from_environ(environ)
    if read.spin is not None:
        return read.spin
    local_ranks = read.environ.get("LOCAL_WORLD_SIZE", "").strip()
    if not local_ranks.isdigit():
        return 0.0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return DEFAULT_SPIN_SECONDS if int(local_ranks) <= cores else 0.0


def may_spin() -> bool:
    """Whether the calling thread may spin (see the module doc); True unless forbidden."""
    return getattr(_here, "may_spin", True)


def forbid_spinning_here() -> None:
    """The calling thread runs the loop for callers that do not wait on it: it never spins."""
    _here.may_spin = False

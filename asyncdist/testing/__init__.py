"""Test your distributed code: ranks in one loop, or as processes.

* :func:`local_world` — n ranks in the current event loop over loopback sockets.
* :func:`crash` — make one of them die as under SIGKILL (fault-injection tests).
* :func:`virtual_time` — run the loop on a clock that skips the waits (timeouts in milliseconds).
* :func:`spawn` — run a function on n rank processes and collect the results.
* :class:`FaultPlan` — what goes wrong during a test, as one seeded line
  (``local_world(n, faults=...)``, ``spawn(n, fn, faults=...)``); :class:`RankKilled`
  stands for a rank a plan killed.
"""

from __future__ import annotations

from .faults import FaultPlan
from .injector import RankKilled
from .spawn import RemoteTraceback, spawn
from .virtual_time import is_virtual, virtual_time
from .world import crash, local_world

__all__ = ["local_world", "crash", "virtual_time", "is_virtual", "spawn", "RemoteTraceback", "FaultPlan", "RankKilled"]

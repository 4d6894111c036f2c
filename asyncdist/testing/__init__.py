"""Test your distributed code: ranks in one loop, or as processes.

* :func:`local_world` — n ranks in the current event loop over loopback sockets.
* :func:`crash` — make one of them die as under SIGKILL (fault-injection tests).
* :func:`spawn` — run a function on n rank processes and collect the results.
"""

from __future__ import annotations

from .spawn import RemoteTraceback, spawn
from .world import crash, local_world

__all__ = ["local_world", "crash", "spawn", "RemoteTraceback"]

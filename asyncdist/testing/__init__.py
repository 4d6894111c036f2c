"""Test your distributed code: ranks in one loop, or as processes.

* :func:`local_world` — n ranks in the current event loop over loopback sockets.
* :func:`spawn` — run a function on n rank processes and collect the results.
"""

from __future__ import annotations

from .spawn import RemoteTraceback, spawn
from .world import local_world

__all__ = ["local_world", "spawn", "RemoteTraceback"]

"""torch.distributed's debugging helpers: ``breakpoint`` and ``record_comm``.

``breakpoint`` stops one rank in pdb while the others wait in a barrier, as
torch's does; the wait is bounded by ``timeout_s``, not by the group's
timeout, so a debugging session is not cut short. ``record_comm`` names the
collectives issued inside it; asyncdist's flight recorder does not take
such names yet, so it only checks its argument.

Thread affinity: any thread but asyncdist's loop thread.
"""

from __future__ import annotations

import contextlib
import sys
import traceback
from datetime import timedelta
from typing import Any, Iterator

from ..errors import InvalidArgumentError
from .collectives import barrier
from .lifecycle import get_rank

__all__ = ["breakpoint", "record_comm"]

_skipped: dict[int, int] = {}  # calls skipped so far, per call site (torch's _breakpoint_cache)


def breakpoint(rank: int = 0, skip: int = 0, timeout_s: Any = 3600) -> None:  # noqa: A001 (torch's name)
    """Break into pdb on ``rank`` only; every other rank waits in a barrier.

    Args:
        rank: the global rank that breaks.
        skip: let the first ``skip`` calls from this call site pass.
        timeout_s: seconds the others wait for the debugging rank (None: the
            group's timeout).

    Example::

        dist.breakpoint()   # rank 0 gets a pdb prompt; type 'up' to reach the caller
    """
    if skip > 0:
        key = hash(str(traceback.format_exc()))
        _skipped[key] = _skipped.get(key, 0) + 1
        if _skipped[key] <= skip:
            return
    if get_rank() == rank:
        debugger = _distributed_pdb()
        debugger.message(
            f"\n!!! ATTENTION !!!\n\nType 'up' to get to the frame that called dist.breakpoint(rank={rank})\n"
        )
        debugger.set_trace(sys._getframe(1))
    barrier(timeout=None if timeout_s is None else timedelta(seconds=float(timeout_s)))


def _distributed_pdb() -> Any:
    """A Pdb that reads the terminal even in a spawned rank (whose stdin is closed)."""
    import pdb  # only when a breakpoint is hit

    class DistributedPdb(pdb.Pdb):
        def interaction(self, *args: Any, **kwargs: Any) -> None:
            stdin = sys.stdin
            try:
                with open("/dev/stdin") as sys.stdin:
                    super().interaction(*args, **kwargs)
            finally:
                sys.stdin = stdin

    return DistributedPdb()


@contextlib.contextmanager
def record_comm(name: str) -> Iterator[None]:
    """Name the collectives issued inside the block (torch's profiling name).

    Accepted so that code written for torch runs; asyncdist's flight recorder
    does not record the name yet.

    Raises:
        InvalidArgumentError: ``name`` is not a string.
    """
    if not isinstance(name, str):
        raise InvalidArgumentError(f"record_comm: name must be a str, got {name!r}")
    yield

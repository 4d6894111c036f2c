"""torch.distributed's debugging helpers, ``breakpoint`` and ``record_comm``, and
asyncdist's own: ``dump_trace`` (the flight recorder) and ``get_stats`` (the counters).

``breakpoint`` stops one rank in pdb while the others wait in a barrier, as
torch's does; the wait is bounded by ``timeout_s``, not by the group's
timeout, so a debugging session is not cut short. ``record_comm`` names the
collectives issued inside it; asyncdist's flight recorder does not take
such names yet, so it only checks its argument.

Thread affinity: any thread but asyncdist's loop thread.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator

from ..errors import InvalidArgumentError
from .barriers import barrier
from .lifecycle import Group, _member_and_portal, _world, get_rank

__all__ = ["breakpoint", "record_comm", "dump_trace", "get_stats"]

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


def dump_trace(path: str | os.PathLike[str] | None = None) -> Path:
    """Write this rank's flight recorder to a JSON file now; return its path.

    ``asyncdist-trace analyze DIR`` reads a folder of every rank's dumps.

    Args:
        path: a file, or a folder to write ``asyncdist-trace-rank<R>.json``
            into (None: ``ASYNCDIST_TRACE_DIR``, else a new temporary folder).

    Example::

        dist.dump_trace("/tmp/traces")   # on every rank, then: asyncdist-trace analyze /tmp/traces
    """
    world = _world()
    _, portal = _member_and_portal(None)
    return portal.call(world.dump_trace, path, what="dump_trace()")


def get_stats(group: Group = None, reset: bool = False) -> dict[str, Any] | None:
    """This rank's counters for ``group`` (default: the world); see ``ProcessGroup.stats``.

    Returns:
        ``{"peers": {global rank: {"sent_bytes", "sent_messages",
        "received_bytes", "received_messages", "same_host"}}, "ops": {op:
        {"count", "seconds"}}, "wait_seconds", "same_host_bytes",
        "socket_bytes"}``; None if this rank is not in ``group``.
        ``reset=True`` zeroes the counters after reading them.
    """
    member, portal = _member_and_portal(group)
    if member is None:
        return None
    return portal.call(member.stats, reset, what="get_stats()")

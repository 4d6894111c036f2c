"""Virtual time for ranks in one loop: the clock jumps ahead whenever they all wait on timers.

Timeouts, heartbeat losses, hang warnings and retries are the behaviour a
fault-tolerant program most needs tested, and in real time they make tests
slow: a heartbeat timeout is seconds of waiting for nothing. Under
:func:`virtual_time`, the running loop's clock (``loop.time()``, which every
timer of asyncdist reads) stops following the wall clock. When nothing is
ready to run and no socket has data, the loop moves its clock straight to
the next timer instead of sleeping. Bytes still travel over real sockets:
the clock moves only when none are in flight.

The clock is `looptime <https://pypi.org/project/looptime/>`_'s, which
patches an asyncio event loop in place; asyncdist adds only what ranks in
one loop need (entering it on a loop that is already running, with the
clock carried on from the wall clock). uvloop's clock belongs to libuv and
cannot be replaced, so virtual time needs asyncio's own loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Iterator

from ..errors import InvalidArgumentError

__all__ = ["virtual_time", "is_virtual"]


def _looptime() -> Any:
    try:
        import looptime
    except ImportError:
        raise InvalidArgumentError(
            "virtual time needs the looptime package: pip install looptime (or asyncdist[test])") from None
    return looptime


def is_virtual(loop: asyncio.AbstractEventLoop | None = None) -> bool:
    """Whether ``loop`` (the running loop by default) is on virtual time now."""
    loop = loop or asyncio.get_running_loop()
    return bool(getattr(loop, "looptime_on", False))


@contextlib.contextmanager
def virtual_time(loop: asyncio.AbstractEventLoop | None = None) -> Iterator[None]:
    """Run ``loop`` (the running loop by default) on virtual time inside this block.

    The virtual clock starts where the loop's clock stands and only moves
    forward; inside an outer ``virtual_time`` block this changes nothing.
    After the block, ``loop.time()`` follows the wall clock again, so a timer
    set inside it and still pending afterwards fires later by the time that
    was skipped (close what the block started before leaving it, as
    :func:`~asyncdist.testing.local_world` does).

    Raises:
        InvalidArgumentError: the loop is not asyncio's own (uvloop's clock
            cannot be replaced), or looptime is not installed.
    """
    loop = loop or asyncio.get_running_loop()
    if is_virtual(loop):
        yield
        return
    if not isinstance(loop, asyncio.BaseEventLoop):
        raise InvalidArgumentError(
            f"virtual time needs asyncio's own event loop; the clock of {type(loop).__module__}."
            f"{type(loop).__name__} cannot be replaced")
    wall = loop.time()
    patched = _looptime().patch_event_loop(loop, start=wall, _enabled=False)
    with patched.looptime_enabled():
        if loop.time() < wall:  # the wall clock overtook what an earlier block left
            patched.setup_looptime(start=wall)
        yield

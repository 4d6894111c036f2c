"""The blocking facade's barriers: ``barrier`` (with torch's ``timeout``) and ``monitored_barrier``.

Submitted through :func:`asyncdist.facade.collectives._submit` as every other
group call of the facade, with torch's rules (a rank not in ``group``
returns None at once); the barrier itself, and the monitored one's verdict
naming the ranks that did not enter, live in the await API.

Thread affinity: any thread but asyncdist's loop thread (a call there raises
:class:`~asyncdist.errors.WrongThreadError` instead of deadlocking).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any, Coroutine

from ..errors import OperationTimeoutError
from ..group.work import Work
from ..timeouts import as_seconds
from .collectives import _submit
from .lifecycle import Group

__all__ = ["barrier", "monitored_barrier"]


def barrier(
    group: Group = None, async_op: bool = False, device_ids: Any = None, timeout: timedelta | None = None
) -> Work | None:
    """Wait until every rank of ``group`` has entered the barrier.

    Any thread but asyncdist's loop thread (there it raises WrongThreadError).

    Args:
        group: the process group (default: the world).
        async_op: return a Work instead of waiting.
        device_ids: accepted for torch compatibility; unused on CPU.
        timeout: bound on this barrier (a ``timedelta`` or seconds); None:
            the group's timeout.

    Returns:
        A Work if ``async_op``, else None (also None if this rank is not in ``group``).

    Raises:
        PeerLostError: a rank of the group is gone.
        OperationTimeoutError: not every rank entered within the timeout.
    """
    if timeout is None:
        return _submit(group, "barrier", lambda g: g.barrier(), async_op)
    seconds = as_seconds(timeout, default=0.0, what="barrier: timeout")
    return _submit(group, "barrier", lambda g: _within(g.barrier(), seconds, f"barrier of group {g.name!r}"), async_op)


async def _within(coro: Coroutine[Any, Any, Any], seconds: float, what: str) -> Any:
    """Await ``coro``, cancelling it after ``seconds`` with OperationTimeoutError.

    ``coro`` runs as a Task of its own, watched by ``asyncio.wait``: a
    blocking call runs without a Task (:mod:`asyncdist.loop.turns`), and
    ``asyncio.timeout`` needs one, as ``wait_for`` does from Python 3.12.
    """
    task = asyncio.ensure_future(coro)
    try:
        done, _ = await asyncio.wait((task,), timeout=seconds)
    except BaseException:  # cancelled from outside: so is the call
        task.cancel()
        raise
    if not done:
        task.cancel()
        await asyncio.wait((task,))
        raise OperationTimeoutError(f"{what} Timed out after {seconds:g} s (its timeout argument)")
    return task.result()


def monitored_barrier(group: Group = None, timeout: timedelta | float | None = None, wait_all_ranks: bool = False) -> None:
    """A barrier that names the ranks that did not enter it.

    Any thread but asyncdist's loop thread (there it raises WrongThreadError).

    Group rank 0 waits up to ``timeout`` for every other rank; the others
    wait for rank 0's verdict. Useful to find a rank that hangs or skipped a
    collective. Blocks; there is no ``async_op``.

    Args:
        group: the process group (default: the world).
        timeout: a ``timedelta`` (or seconds); None: the group's timeout.
        wait_all_ranks: rank 0 names every missing rank, not only the first.

    Returns:
        None.

    Raises:
        OperationTimeoutError: on every rank that entered, if some rank did not
            enter within ``timeout`` (or was lost); the message names it
            ("rank 3 failed to pass it within 2 s").

    Example::

        if dist.get_rank() != 1:
            dist.monitored_barrier(timeout=timedelta(seconds=2))   # names rank 1
    """
    _submit(group, "monitored_barrier", lambda g: g.monitored_barrier(timeout, wait_all_ranks), False)

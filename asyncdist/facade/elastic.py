"""The facade's side of rejoining: ``grow_group`` (asyncdist's own; torch has no such call).

A process started with ``ASYNCDIST_JOIN=1`` (``asyncdist-run --replace``
sets it) waits in ``init_process_group`` until the running job's ranks call
:func:`grow_group`; then every one of them, newcomer included, has the same
bigger default group. The await API's
:meth:`~asyncdist.group.process_group.ProcessGroup.grow` does the work; this
module only swaps the default group, as ``shrink_group`` does for a smaller one.
"""

from __future__ import annotations

from datetime import timedelta

from ..group.process_group import ProcessGroup
from .lifecycle import _portal, _runtime, _use_backend, _world

__all__ = ["grow_group"]


def grow_group(timeout: timedelta | float | None = None, min_joiners: int = 0) -> ProcessGroup:
    """Admit the processes waiting to join; the grown group becomes the default group.

    Every rank of the default group calls it, at a point of its choosing (a
    step boundary); the processes waiting in ``init_process_group`` with
    ``ASYNCDIST_JOIN=1`` return from it with the same group, ranked after
    the members. Groups made from the old default group stay as they were
    (without the newcomers). Any thread but asyncdist's loop thread.

    Args:
        timeout: seconds (or a ``timedelta``) to wait for ``min_joiners``; None: the group's timeout.
        min_joiners: wait until at least this many processes wait to join
            (0: admit whoever waits now, maybe nobody).

    Returns:
        The default group afterwards: the same object when nobody was waiting.

    Raises:
        NotInitializedError: before ``init_process_group``.
        RendezvousError, PeerLostError: see :meth:`ProcessGroup.grow`.

    Example::

        if step == 100:
            dist.grow_group()          # a replacement started meanwhile joins here
            dist.broadcast(params, src=0)
    """
    world, portal = _world(), _portal()
    grown = portal.run(world.grow(timeout=timeout, min_joiners=min_joiners), what="grow_group()")
    if grown is not world:
        _runtime.world = grown
        portal.call(_use_backend, grown, _runtime.backend, grown.store, what="grow_group()")
    return grown

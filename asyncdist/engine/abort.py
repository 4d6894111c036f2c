"""Telling the other ranks of a collective call that it failed here.

When a rank's part of a collective fails (a mismatch it detected, a lost
peer, a timeout, a cancellation), the ranks waiting on it would otherwise wait for data
that never comes, until their own timeout. Instead the failing rank sends
an :class:`~asyncdist.wire.control.Abort` frame for the call (its context
and tag) to every other member, and each of them fails the call's receives
with the same kind of error, marked as relayed so that it is not relayed
again.

This module turns an error into an Abort frame and back (sans-I/O): the
frame names the error's class, which is mapped back to a class here.
"""

from __future__ import annotations

from ..errors import (
    AsyncDistError, CollectiveMismatchError, OperationCancelledError, OperationTimeoutError, PeerLostError,
)
from ..wire.control import Abort

__all__ = ["abort_frame", "error_from_abort", "is_relayed"]

# Error kinds an Abort may carry; anything else travels as AsyncDistError.
_KINDS: dict[str, type[AsyncDistError]] = {
    "PeerLostError": PeerLostError,
    "CollectiveMismatchError": CollectiveMismatchError,
    "OperationTimeoutError": OperationTimeoutError,
    "OperationCancelledError": OperationCancelledError,
}


def abort_frame(src: int, ctx: int, tag: int, error: BaseException) -> Abort:
    """The Abort frame for call (ctx, tag) that failed with ``error`` on ``src``."""
    kind = type(error).__name__ if type(error).__name__ in _KINDS else "AsyncDistError"
    lost = error.rank if isinstance(error, PeerLostError) else None
    return Abort(src, ctx, tag, kind, str(error), lost)


def error_from_abort(frame: Abort) -> AsyncDistError:
    """The error a receiving rank raises for an Abort frame."""
    reason = f"{frame.reason} (relayed by rank {frame.src})"
    kind = _KINDS.get(frame.error, AsyncDistError)
    if kind is PeerLostError:
        error: AsyncDistError = PeerLostError(reason, frame.src if frame.lost is None else frame.lost)
    else:
        error = kind(reason)
    error.relayed_from = frame.src
    return error


def is_relayed(error: BaseException) -> bool:
    """True for an error that came in an Abort (it must not be relayed again)."""
    return getattr(error, "relayed_from", None) is not None

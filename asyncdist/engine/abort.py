"""Telling the other ranks of a collective call that it failed here.

When a rank's part of a collective fails (a mismatch it detected, a lost
peer, a timeout, a cancellation), the ranks waiting on it would otherwise wait for data
that never comes, until their own timeout. Instead the failing rank sends
an ABORT frame for the call (its context and tag) to every other member,
and each of them fails the call's receives with the same kind of error,
marked as relayed so that it is not relayed again.

This module turns an error into an ABORT header and back (sans-I/O).
"""

from __future__ import annotations

from ..errors import (
    AsyncDistError, CollectiveMismatchError, OperationCancelledError, OperationTimeoutError, PeerLostError,
)
from ..wire.frames import Header, Kind

__all__ = ["abort_header", "error_from_abort", "is_relayed"]

# Error kinds an ABORT may carry; anything else travels as AsyncDistError.
_KINDS: dict[str, type[AsyncDistError]] = {
    "PeerLostError": PeerLostError,
    "CollectiveMismatchError": CollectiveMismatchError,
    "OperationTimeoutError": OperationTimeoutError,
    "OperationCancelledError": OperationCancelledError,
}
_MAX_REASON_CHARS = 2000


def abort_header(src: int, ctx: int, tag: int, error: BaseException) -> Header:
    """The ABORT frame (header only) for call (ctx, tag) that failed with ``error`` on ``src``."""
    kind = type(error).__name__ if type(error).__name__ in _KINDS else "AsyncDistError"
    shape = (error.rank,) if isinstance(error, PeerLostError) else ()
    return Header(Kind.ABORT, ctx, src, tag, max(tag, 0), kind, shape, 0, str(error)[:_MAX_REASON_CHARS])


def error_from_abort(header: Header) -> AsyncDistError:
    """The error a receiving rank raises for an ABORT frame."""
    reason = f"{header.op} (relayed by rank {header.src})"
    kind = _KINDS.get(header.dtype, AsyncDistError)
    if kind is PeerLostError:
        lost = header.shape[0] if header.shape else header.src
        error: AsyncDistError = PeerLostError(reason, lost)
    else:
        error = kind(reason)
    error.relayed_from = header.src
    return error


def is_relayed(error: BaseException) -> bool:
    """True for an error that came in an ABORT (it must not be relayed again)."""
    return getattr(error, "relayed_from", None) is not None

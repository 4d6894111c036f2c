"""Timeouts as users give them (seconds or ``timedelta``), as seconds.

torch.distributed takes ``timedelta`` s; the await API also takes plain
seconds. Every layer that accepts a timeout converts it here, so that one
rule says what a valid timeout is and one message says what was wrong.
"""

from __future__ import annotations

import math
from datetime import timedelta

from .errors import InvalidArgumentError

__all__ = ["DEFAULT_TIMEOUT", "as_seconds"]

#: torch.distributed's default timeout for process groups (30 minutes).
DEFAULT_TIMEOUT = timedelta(minutes=30)


def as_seconds(timeout: timedelta | float | None, *, default: float, what: str, positive: bool = True) -> float:
    """``timeout`` in seconds; None gives ``default``.

    Args:
        timeout: a ``timedelta`` or a number of seconds (not a bool), or None.
        default: the seconds that None stands for.
        what: the argument, as the error message names it ("new_group: timeout").
        positive: refuse 0 too (group operations); False accepts 0 (stores).

    Raises:
        InvalidArgumentError: ``timeout`` is not a duration, or negative, NaN,
            or (with ``positive``) zero.
    """
    if timeout is None:
        return float(default)
    if isinstance(timeout, timedelta):
        value = timeout.total_seconds()
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        value = float(timeout)
    else:
        raise InvalidArgumentError(f"{what} must be a timedelta or seconds, not {type(timeout).__name__}")
    if math.isnan(value) or value < 0 or (positive and value == 0):
        bound = "positive" if positive else ">= 0 seconds"
        raise InvalidArgumentError(f"{what} must be {bound}, got {timeout!r}")
    return value


"""The rules of a store call, apart from any store: its arguments and its updates.

This module owns what every store agrees on before and after touching its data:

* **Arguments.** :func:`as_key`, :func:`as_keys`, :func:`as_value`,
  :func:`as_amount` and :func:`timeout_seconds` check and normalise what a
  caller passes to torch's ``Store`` API, raising
  :class:`~asyncdist.errors.InvalidArgumentError` for anything torch refuses.
* **Read-modify-write.** :func:`apply_add` and :func:`apply_compare_set` compute
  what ``add`` and ``compare_set`` store and answer, written once and used by
  every concrete store (and by the TCP store's server).

It must not know any store, thread, lock, file or socket: each function maps
values to values, so the stores differ only in how they hold their data.

Invariants: keys are ``str``; values are ``bytes`` (a ``str`` is UTF-8 encoded);
counters are int64, stored as ASCII decimal; timeouts are floats in
``[0, MAX_TIMEOUT_S]`` seconds.
"""

from __future__ import annotations

import operator
import re
from datetime import timedelta
from typing import Any, Iterable

from ..errors import InvalidArgumentError
from ..timeouts import as_seconds

__all__ = [
    "MAX_TIMEOUT_S",
    "apply_add",
    "apply_compare_set",
    "as_amount",
    "as_key",
    "as_keys",
    "as_value",
    "is_int",
    "timeout_seconds",
]

#: Longer timeouts (``timedelta.max``, ``inf``) are cut to this many seconds (a
#: year): lock and socket timeouts overflow somewhere past 2**63 ns.
MAX_TIMEOUT_S = 365 * 24 * 3600.0

# What C's stoll accepts (torch parses counters with it): "12x" reads as 12.
_STOLL = re.compile(rb"[ \t\n\v\f\r]*([+-]?[0-9]+)")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


# -- arguments --------------------------------------------------------------


def is_int(x: Any) -> bool:
    """Return whether ``x`` is an ``int`` and not a ``bool`` (torch refuses ``True``)."""
    return isinstance(x, int) and not isinstance(x, bool)


def timeout_seconds(timeout: timedelta | float | None, default: float) -> float:
    """Normalise a torch-style timeout to seconds.

    Args:
        timeout: a ``timedelta``, a number of seconds, or ``None``.
        default: seconds to use when ``timeout`` is ``None``.

    Returns:
        The timeout in seconds, a float in ``[0, MAX_TIMEOUT_S]``.

    Raises:
        InvalidArgumentError: ``timeout`` is negative or not a duration.
    """
    return min(as_seconds(timeout, default=default, what="store timeout", positive=False), MAX_TIMEOUT_S)


def as_key(key: Any) -> str:
    """Return ``key``. Raises InvalidArgumentError unless it is a ``str``."""
    if not isinstance(key, str):
        raise InvalidArgumentError(f"store keys must be str, not {type(key).__name__}")
    return key


def as_keys(keys: Iterable[str]) -> list[str]:
    """Return ``keys`` as a list of ``str``; a lone ``str`` or ``bytes`` is refused."""
    if isinstance(keys, (str, bytes)) or not hasattr(keys, "__iter__"):
        raise InvalidArgumentError(f"store keys must be a list of str, not {type(keys).__name__}")
    return [as_key(k) for k in keys]


def as_value(value: Any) -> bytes:
    """Return ``value`` as ``bytes`` (a ``str`` UTF-8 encoded; bytes-likes copied)."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise InvalidArgumentError(f"store values must be str or bytes, not {type(value).__name__}")


def as_amount(amount: Any) -> int:
    """Return ``add``'s ``amount`` as an ``int``.

    Raises:
        InvalidArgumentError: not an integer (``operator.index`` refuses it), or
            outside the int64 range of torch's counters.
    """
    try:
        amount = operator.index(amount)
    except TypeError:
        raise InvalidArgumentError(
            f"add: amount must be an int, not {type(amount).__name__}"
        ) from None
    if not _INT64_MIN <= amount <= _INT64_MAX:
        raise InvalidArgumentError(f"add: amount {amount} is outside the int64 range")
    return amount


# -- read-modify-write ------------------------------------------------------


def apply_add(key: str, current: bytes | None, amount: int) -> int:
    """The ``add`` rule: the new value of ``key`` (store it as ``str(n)`` in ASCII).

    A missing or empty value counts as 0. Otherwise the value is read as C's
    ``stoll`` reads it, as torch does: leading whitespace, an optional sign and
    digits, anything after them ignored. Raises :class:`InvalidArgumentError` when
    no digits lead the value (torch raises ``ValueError`` there), or when the
    sum leaves the int64 range torch's counters have.
    """
    match = _STOLL.match(current) if current else None
    if current and match is None:
        raise InvalidArgumentError(
            f"add: the value of key {key!r} is not an integer: {current[:40]!r}"
        )
    total = (int(match.group(1)) if match else 0) + amount
    if not _INT64_MIN <= total <= _INT64_MAX:
        raise InvalidArgumentError(f"add: key {key!r} would leave the int64 range: {total}")
    return total


def apply_compare_set(
    current: bytes | None, expected: bytes, desired: bytes
) -> tuple[bytes | None, bytes]:
    """torch's ``compare_set`` rule.

    Returns:
        ``(new_value, reply)``: ``new_value`` is what the key must be set to, or
        ``None`` to leave the store unchanged; ``reply`` is what the call returns.
        The key is set when it is missing and ``expected == b""``, or when it holds
        ``expected``; otherwise a missing key answers ``expected`` and a present key
        answers its current value.
    """
    if (current is None and expected == b"") or current == expected:
        return desired, desired
    if current is None:
        return None, expected
    return None, current

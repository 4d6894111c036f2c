"""Message contexts of groups made by some members only: derived, not counted.

A group made by ``new_group`` takes its contexts from the engine's counter,
which stays in step across ranks because every rank of the job creates the
same groups in the same order. A group that only some ranks make (the
survivors' group of a ``shrink``, the parts of a ``split_group``) must not
move the counter, or the ranks that did not take part would fall out of
step. Its members derive its contexts instead, from the parent group's
collective context and a label that every member computes alike (which
shrink or split of the parent it is, and which part).
"""

from __future__ import annotations

import hashlib
import itertools
from typing import Callable

__all__ = ["derived_contexts"]

# Derived contexts live above every counted one (the counter starts at 0 and
# grows by a few per group), and below 2**63, which msgpack carries as an int.
_DERIVED_BASE = 1 << 62


def derived_contexts(parent: int, label: str) -> Callable[[], int]:
    """The context allocator of a group made by agreement: every member derives
    the same sequence from the parent group's context and ``label`` (56-bit
    hashes: a collision among a job's groups has odds under 2**-40)."""
    counter = itertools.count()

    def take() -> int:
        digest = hashlib.blake2b(f"{parent}/{label}/{next(counter)}".encode(), digest_size=7).digest()
        return _DERIVED_BASE | int.from_bytes(digest, "big")

    return take

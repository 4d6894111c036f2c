"""Lost peers, and which receive a loss dooms (sans-I/O).

The engine records here every peer whose stream ended, and whether it said
goodbye first (BYE: an orderly close, after flushing everything it sent) or
crashed. The rules that decide which pending or future receive can no
longer complete live here, apart from sockets and futures:

* a receive that names its sender fails once that sender is gone;
* a collective's receive fails once any other member of the call crashed
  (the call cannot complete); a member that left in order finished its
  part first, so that fails nobody;
* an any-source receive (``src=None``) fails once one candidate crashed
  (it may have been the sender, as in MPI's ULFM), or once every candidate
  is gone.
"""

from __future__ import annotations

import signal
from typing import Iterable

from ..errors import PeerLostError
from .matching import PostedRecv

__all__ = ["Losses", "goodbye"]


def goodbye(rank: int, signum: int) -> str:
    """How a peer's BYE reads: why it left, when its tag names a signal."""
    if signum == signal.SIGINT:
        return f"rank {rank} was interrupted (SIGINT)"
    if signum == signal.SIGTERM:
        return f"rank {rank} was terminated (SIGTERM)"
    if signum:
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        return f"rank {rank} was stopped ({name})"
    return f"rank {rank} closed its process group"


class Losses:
    """The peers one rank has lost, and the rules above.

    Attributes:
        errors: the error each lost peer was lost with, by rank (read only;
            empty while no peer is lost, which the engine tests per receive).
    """

    __slots__ = ("errors", "_left")

    def __init__(self) -> None:
        self.errors: dict[int, PeerLostError] = {}
        self._left: set[int] = set()  # lost peers that said goodbye first

    def record(self, rank: int, error: PeerLostError, *, orderly: bool) -> bool:
        """Record the loss of ``rank``; False if it was already recorded."""
        if rank in self.errors:
            return False
        self.errors[rank] = error
        if orderly:
            self._left.add(rank)
        return True

    def __contains__(self, rank: object) -> bool:
        return rank in self.errors

    def left(self, rank: int) -> bool:
        """Whether ``rank`` said goodbye before its stream ended (an orderly close, not a crash)."""
        return rank in self._left

    def error(self, rank: int) -> PeerLostError | None:
        """The error that ended the stream to ``rank``, if it has ended."""
        return self.errors.get(rank)

    def fatal_for(self, recv: PostedRecv) -> PeerLostError | None:
        """The loss that dooms ``recv``, or None while it can still complete.

        Runs for every posted receive, so with no loss it returns at once: a
        collective's ``sources`` are all the other members, and looking at
        each of them made a message cost O(n) (63 lookups per message at n = 64).
        """
        if not self.errors:
            return None
        if recv.src is not None and recv.src in self.errors:
            return self.errors[recv.src]
        if recv.op is not None:
            return next((self.errors[r] for r in recv.sources if self._crashed(r)), None)
        if recv.src is None:
            return self._among(recv.sources)
        return None

    def _crashed(self, rank: int) -> bool:
        return rank in self.errors and rank not in self._left

    def _among(self, ranks: Iterable[int]) -> PeerLostError | None:
        ranks = list(ranks)
        gone = [rank for rank in ranks if rank in self.errors]
        crashed = [rank for rank in gone if rank not in self._left]
        if crashed:
            return self.errors[crashed[0]]
        if gone and len(gone) == len(ranks):
            return self.errors[gone[-1]]
        return None

"""What an engine keeps to be seen from outside: the flight recorder, its dumps,
the live counters and the hang warnings' questions to peers, in one part.

The :class:`~asyncdist.engine.engine.Engine` owns one :class:`Flight` and
hands it what only the engine sees (control frames, peers' failed calls,
lost peers, its close);
the group layer and the channels reach its parts as ``engine.flight``.
Configuration is read once, here: ``ASYNCDIST_TRACE_BUFFER``,
``ASYNCDIST_TRACE_DIR`` and ``ASYNCDIST_HANG_WARN``.

Loop thread only.
"""

from __future__ import annotations

from typing import Mapping

from ..errors import PeerLostError
from ..transport.stream import Connection
from ..wire.control import Here, Where
from ..wire.handshake import Identity
from .counters import Counters
from .dumps import Dumps
from .recorder import Recorder, capacity_from_env
from .whereabouts import Whereabouts, hang_warn_from_env

__all__ = ["Flight"]


class Flight:
    """One engine's recorder, dumps, counters and hang questions.

    Args:
        me: the engine's identity.
        connections: the engine's live map of peer rank to connection (read only).

    Attributes:
        counters, recorder, dumps, whereabouts: the parts.
        hang_warn: seconds a call waits before asking its peers where they are (0: never).
    """

    def __init__(self, me: Identity, connections: Mapping[int, Connection]) -> None:
        self.counters = Counters(me.world_size)
        self.recorder = Recorder(me.rank, capacity_from_env(), self.counters.ops)
        self.dumps = Dumps(self.recorder, me.world_size, me.job_id)
        self.hang_warn = hang_warn_from_env()
        self.whereabouts = Whereabouts(me.rank, self.recorder, connections)

    def widen(self, world_size: int) -> None:
        """Count and dump for the ids below ``world_size`` too (processes a grow admitted)."""
        self.counters.widen(world_size)
        self.dumps.world_size = world_size

    def control(self, rank: int, frame: Where | Here) -> None:
        """A Where or Here frame from ``rank``. A question is a peer's hang
        warning: this rank also captures its stacks and dumps, and the answer
        says where its user's thread is."""
        if isinstance(frame, Where):
            self.dumps.on_asked(f"rank {rank}'s hang warning asked where this rank is")
            self.whereabouts.question(rank, frame, self.dumps.stacks[-1] if self.dumps.stacks else None)
        else:
            self.whereabouts.answer(rank, frame)

    def aborted(self, rank: int, error: BaseException) -> None:
        """``rank`` failed a call and told this rank (an ABORT): capture the
        stacks and dump, also when this rank is not in that call (it may be
        the reason, stuck in its own code)."""
        self.dumps.on_asked(f"rank {rank} failed a call ({type(error).__name__})")

    def peer_lost(self, rank: int, error: PeerLostError, *, orderly: bool, closing: bool) -> None:
        """The engine lost ``rank``: a failure to dump, unless this rank is closing, or
        the peer left in order (a goodbye) while nothing here waited on it."""
        if not closing and (not orderly or self.recorder.awaits(rank)):
            self.recorder.lost[rank] = str(error)
            self.dumps.on_failure(f"lost rank {rank}")

    async def close(self) -> None:
        """Finish the hang warnings still waiting for answers."""
        await self.whereabouts.close()

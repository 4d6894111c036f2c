"""Fault-tolerant agreement of one group: the core of ``agree`` and ``shrink``.

Every live member of a group calls instance *k* (the group's k-th ``agree``
or ``shrink``) with an integer flag; every one that returns gets the same
:class:`Decision`: the bitwise AND of the flags of the members it counts as
live, and the set of members it counts as failed. This holds even when
members die during the instance, the coordinator included.

The protocol is a rotating coordinator over a failure detector (the
engine's: a stream that ends is a dead peer, a peer silent past the
heartbeat timeout is expelled). Control frames
(:class:`~asyncdist.wire.control.Agree`) carry it, outside MPI matching, so
it works on a revoked group.

* Each member sends its STATE (flag, the members it knows failed) to the
  *coordinator*: the lowest group rank it does not know failed. When that
  changes (a loss), it sends its STATE to the new one.
* The coordinator waits for the STATE of every member it does not know
  failed. Then it decides: the AND of those flags and the union of the
  failed sets (a set received is merged at once: its members are expelled,
  so a false suspicion becomes a real, clean exclusion: fail-stop is
  enforced). It sends DECIDE to every live member and returns.
* A rank that has decided instance k remembers the decision and answers
  any later STATE or QUERY for k with it. A coordinator that is not the
  group's rank 0 (an earlier one may have decided and died during its
  broadcast) first QUERYs every member it has no STATE from; a decision
  any of them reports is adopted and passed on to the members waiting on
  this rank. So a coordinator that dies after a partial broadcast cannot
  cause two decisions among the live.
* Members call instances in the same order, one at a time per group.
* A member that reads a decision, or a failed set, that names itself is
  excluded (:class:`~asyncdist.errors.RankExcludedError`).

What is not promised (as in ULFM): a member that fails after the decision
is not in it; ``failed_ranks()`` then grows on each rank as it notices.

Loop thread only.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterable

from ..engine.operation import wait_until
from ..engine.engine import Engine
from ..errors import ClosedError, InvalidArgumentError, OperationTimeoutError
from ..wire.control import Agree
from .members import Members

__all__ = ["Agreement", "Decision"]

STATE, QUERY, DECIDE = 0, 1, 2
# Decisions remembered, to answer a later coordinator: members are at most a
# few instances apart (each instance waits for every live member).
_REMEMBERED = 256
# Frames of instances this rank has not started yet, kept until it does.
_MAX_EARLY = 4096


@dataclass(frozen=True, slots=True)
class Decision:
    """What an agreement instance decided.

    Attributes:
        value: the bitwise AND of the live members' flags.
        failed: the global ranks of the members counted as failed.
    """

    value: int
    failed: frozenset[int]


@dataclass(slots=True)
class _Instance:
    k: int
    flag: int
    future: asyncio.Future
    states: dict[int, int] = field(default_factory=dict)  # global rank -> its flag
    sent_to: int = -1  # the coordinator this rank's STATE went to
    queried: bool = False


def _body(flag: int, failed: Iterable[int], decided: Decision | None = None) -> str:
    payload: dict = {"f": flag, "F": sorted(failed)}
    if decided is not None:
        payload["d"] = [decided.value, sorted(decided.failed)]
    return json.dumps(payload, separators=(",", ":"))


class Agreement:
    """The agreement instances of one group, on one rank.

    Args:
        engine: this rank's engine.
        members: the group's members.
        ctx: the context its AGREE frames carry (the group's collective context).
    """

    def __init__(self, engine: Engine, members: Members, ctx: int) -> None:
        self._engine = engine
        self._members = members
        self._ctx = ctx
        self._decided: OrderedDict[int, Decision] = OrderedDict()
        self._early: dict[int, list[tuple[int, Agree]]] = {}
        self._early_count = 0
        self._current: _Instance | None = None
        self._next = 0  # the number of this rank's next instance
        self._stop = engine.faults.watch(self._lost)

    def close(self) -> None:
        """Stop watching losses (the group is closed)."""
        self._stop()

    def failed(self, *, crashed: bool = False) -> set[int]:
        """The members (global ranks) this rank knows lost; with ``crashed``,
        not those that closed their process group in order."""
        return {r for r in self._members.ranks if self._engine.is_lost(r, crashed=crashed)}

    def peek_number(self) -> int:
        """The number this rank's next instance will take (members number them in the same order)."""
        return self._next

    async def run(self, flag: int, timeout: float, what: str) -> Decision:
        """Take part in this rank's next instance with ``flag``; return its decision.

        Raises:
            RankExcludedError: the others count this rank as failed.
            OperationTimeoutError: no decision within ``timeout`` seconds.
            InvalidArgumentError: another agreement of the group is under way here.
            ClosedError: the engine closed meanwhile.
        """
        excluded = self._engine.faults.excluded
        if excluded is not None:
            raise excluded
        if self._current is not None:
            raise InvalidArgumentError(
                f"rank {self._members.me}: {what} on group {self._members.name!r} while agreement "
                f"#{self._current.k} is under way: call agree and shrink one at a time")
        k, self._next = self._next, self._next + 1
        loop = asyncio.get_running_loop()
        inst = self._current = _Instance(k, flag, loop.create_future())
        try:
            for src, frame in self._early.pop(k, []):
                self._early_count -= 1
                self._handle(inst, src, frame)
            self._progress()
            return await wait_until(inst.future, loop.time() + timeout, lambda: self._timeout(inst, timeout, what))
        finally:
            self._current = None

    def _timeout(self, inst: _Instance, timeout: float, what: str) -> OperationTimeoutError:
        m = self._members
        live = [r for r in m.ranks if r not in self.failed() and r != m.me]
        missing = [m.group_rank(r) for r in live if r not in inst.states]
        where = f"rank {m.me}: {what} (agreement #{inst.k} of group {m.name!r})"
        if inst.sent_to >= 0:
            return OperationTimeoutError(
                f"{where} did not complete within {timeout:g} s; waiting for the decision of rank "
                f"{m.group_rank(inst.sent_to)}")
        return OperationTimeoutError(
            f"{where} did not complete within {timeout:g} s; waiting for the state of {m.who(missing)}")

    # -- the protocol ------------------------------------------------------------------

    def _send(self, rank: int, k: int, step: int, body: str) -> None:
        self._engine.faults.send(rank, Agree(self._members.me, self._ctx, k, step, body))

    def _progress(self) -> None:
        """Act on what is known now: send STATE to the coordinator, or coordinate."""
        inst, m = self._current, self._members
        if inst is None or inst.future.done():
            return
        failed = self.failed()
        coordinator = next(r for r in m.ranks if r not in failed or r == m.me)
        if coordinator != m.me:
            if inst.sent_to != coordinator:
                inst.sent_to = coordinator
                self._send(coordinator, inst.k, STATE, _body(inst.flag, failed))
            return
        inst.sent_to = -1
        live = [r for r in m.ranks if r not in failed and r != m.me]
        if not inst.queried and m.me != m.ranks[0]:  # an earlier coordinator may have decided
            inst.queried = True
            for r in live:
                if r not in inst.states:
                    self._send(r, inst.k, QUERY, _body(inst.flag, failed))
        if any(r not in inst.states for r in live):
            return
        value = inst.flag
        for r in live:
            value &= inst.states[r]
        self._finish(inst, Decision(value, frozenset(failed)), live)

    def _finish(self, inst: _Instance, decision: Decision, tell: Iterable[int]) -> None:
        """Instance ``inst`` is decided: tell ``tell`` (those that wait on this rank), return it."""
        k = inst.k
        body = _body(0, decision.failed, decision)
        for r in tell:
            if r not in decision.failed:
                self._send(r, k, DECIDE, body)
        self._decided[k] = decision
        while len(self._decided) > _REMEMBERED:
            self._decided.popitem(last=False)
        if not self._merge(decision.failed) and not inst.future.done():
            inst.future.set_result(decision)

    def _merge(self, failed: Iterable[int]) -> bool:
        """Count ``failed`` as failed here too: expel those still connected.
        True if it names this rank (which is then excluded)."""
        m = self._members
        faults = self._engine.faults
        for r in failed:
            if r == m.me:
                faults.exclude(f"rank {m.me} was counted as failed by the agreement of group {m.name!r}")
                return True
            if r in m.others and not self._engine.is_lost(r):
                faults.expel(r, f"the agreement of group {m.name!r} counted it as failed")
        return False

    # -- arrivals ------------------------------------------------------------------------

    def frame(self, src: int, frame: Agree) -> None:
        """An Agree frame of this group arrived from global rank ``src``."""
        k = frame.instance
        if src not in self._members.others:
            return
        decided = self._decided.get(k)
        if decided is not None:  # finished here: tell whoever asks
            if frame.step in (STATE, QUERY):
                self._send(src, k, DECIDE, _body(0, decided.failed, decided))
            return
        inst = self._current
        if inst is not None and inst.k == k:
            self._handle(inst, src, frame)
            self._progress()
        elif k >= self._next - (inst is not None) and self._early_count < _MAX_EARLY:
            self._early.setdefault(k, []).append((src, frame))
            self._early_count += 1

    def _handle(self, inst: _Instance, src: int, frame: Agree) -> None:
        try:
            body = json.loads(frame.body)
            flag, failed = int(body["f"]), [int(r) for r in body["F"]]
            decided = Decision(int(body["d"][0]), frozenset(int(r) for r in body["d"][1])) if "d" in body else None
        except (ValueError, KeyError, TypeError, IndexError):
            return  # not from a well-behaved member of this job; the peer is authenticated, so a bug
        if frame.step == DECIDE and decided is not None:
            # Those that sent their STATE here wait on this rank: a coordinator
            # that adopts an earlier one's decision passes it on.
            self._finish(inst, decided, [r for r in inst.states if r != src])
            return
        if self._merge(failed):
            return
        if frame.step == STATE:
            inst.states[src] = flag
        elif frame.step == QUERY:
            inst.sent_to = src
            self._send(src, inst.k, STATE, _body(inst.flag, self.failed()))

    def _lost(self, rank: int) -> None:
        """A peer was lost, or this rank was excluded (engine hook)."""
        inst = self._current
        if inst is None or inst.future.done():
            return
        excluded = self._engine.faults.excluded
        if excluded is not None or self._engine.closed:
            closed = ClosedError(f"rank {self._members.me}: the process group was destroyed")
            inst.future.set_exception(excluded or closed)
            inst.future.exception()
        elif rank in self._members.others:
            asyncio.get_running_loop().call_soon(self._progress)

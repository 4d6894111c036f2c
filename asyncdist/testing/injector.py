"""Applying a fault plan: the hooks a :class:`~.faults.FaultPlan` installs in a process.

One :class:`Injector` per installed plan, in the process that runs the
ranks: the test's process for :func:`~asyncdist.testing.local_world` (every
rank in one loop), or each rank process of :func:`~asyncdist.testing.spawn`
(which passes the plan in ``ASYNCDIST_FAULTS``). It reaches the runtime at two
seams that cost nothing while no plan is installed:

* :data:`asyncdist.engine.operation.ON_OPEN`, called as a rank opens an
  operation: the injector counts the rank's operations by name and, at a
  ``kill`` or ``pause`` trigger, kills or stops the rank;
* :data:`asyncdist.transport.injection.INJECTOR`, asked once per
  connection: links a plan delays, slows, cuts or partitions get a
  :class:`LinkGate` (each direction its own); ``refuse`` fails dials at init.

The same plan does the same thing in both settings, by their own means:

| fault | ranks in one loop | rank processes |
|---|---|---|
| kill | :func:`~asyncdist.testing.crash`; :class:`RankKilled` raised into this and later operations | SIGKILL |
| pause | the rank's links hold their frames; its heartbeat declares nobody lost | SIGSTOP, later SIGCONT |
| links | the sending side's gate, in that process | the same |

Jitter is drawn per link direction from ``(seed, source, destination)``,
so it does not depend on how the ranks' frames interleave. Loop thread
only, except :func:`install` and :func:`uninstall`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
from collections import deque
from typing import Any, Callable

from ..engine import operation
from ..flight.descriptions import Description
from ..transport import injection
from .faults import ANY, Cut, Delay, FaultPlan, Kill, Partition, Pause, Refuse, Slow

__all__ = ["Injector", "LinkGate", "RankKilled", "install", "uninstall", "installed", "note_plan"]


class RankKilled(BaseException):
    """A fault plan killed rank ``rank`` (at ``where``).

    In one loop it is raised into the killed rank's operation, and into each
    later one: a ``BaseException``, as a killed process's code does not go
    on in an ``except Exception``. From :func:`~asyncdist.testing.spawn` it is
    the *result* of a rank a plan killed, by rank, among the others' results.
    """

    def __init__(self, rank: int, where: str) -> None:
        super().__init__(rank, where)
        self.rank, self.where = rank, where

    def __str__(self) -> str:
        return f"rank {self.rank} was killed by the fault plan at {self.where}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RankKilled) and other.args == self.args

    def __hash__(self) -> int:
        return hash(self.args)


class LinkGate:
    """One direction of one link under a plan: delays, a rate, and windows when it carries nothing.

    Frames leave in the order they were sent, each no earlier than its delay
    (plus jitter) after it was sent, than the link has carried the bytes
    before it at the rate, and than the end of a window that holds it.
    """

    def __init__(self, src: int, dst: int, seed: int | None) -> None:
        self.src, self.dst = src, dst
        self.delay = 0.0
        self.jitter = 0.0
        self.rate = 0.0  # bytes per second; 0: unlimited
        self.windows: list[tuple[float, float]] = []  # loop times [start, end) when nothing passes
        self._rng = random.Random(f"{seed or 0}/{src}/{dst}")
        self._free_at = 0.0
        self._queue: deque[tuple[float, Callable[[], Any], asyncio.Future]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._closer: asyncio.TimerHandle | None = None
        self._close: Callable[[], None] | None = None
        self._releasing = False

    def hold(self, start: float, end: float) -> None:
        """Carry nothing from loop time ``start`` to ``end``."""
        self.windows.append((start, end))

    def blocked_until(self, when: float) -> float:
        """The first time at or after ``when`` outside every window."""
        moved = True
        while moved:
            moved = False
            for start, end in self.windows:
                if start <= when < end:
                    when, moved = end, True
        return when

    def next_delay(self) -> float:
        """The delay of the next frame: the fixed one, plus its jitter from the seed."""
        return self.delay + (self._rng.uniform(0.0, self.jitter) if self.jitter else 0.0)

    def send(self, write: Callable[[], asyncio.Future | None], nbytes: int) -> asyncio.Future | None:
        loop = asyncio.get_running_loop()
        if self._releasing:  # sent by a frame being released (a payload's header): part of it
            return write()
        now = loop.time()
        at = now + self.next_delay()
        if self.rate:
            self._free_at = max(now, self._free_at) + nbytes / self.rate
            at = max(at, self._free_at)
        if self._queue:
            at = max(at, self._queue[-1][0])
        if not self._queue and at <= now and self.blocked_until(now) <= now:
            return write()
        future = loop.create_future()
        future.add_done_callback(_retrieve)  # a held ping's loss is the connection's to report
        self._queue.append((at, write, future))
        self._arm(loop)
        return future

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._queue and self._timer is None:
            self._timer = loop.call_at(self.blocked_until(self._queue[0][0]), self._release)

    def _release(self) -> None:
        self._timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._releasing = True
        try:
            while self._queue and self._queue[0][0] <= now and self.blocked_until(now) <= now:
                _, write, future = self._queue.popleft()
                try:
                    inner = write()
                except Exception as exc:  # the connection ended meanwhile (PeerLostError)
                    if not future.done():
                        future.set_exception(exc)
                    continue
                _chain(inner, future)
        finally:
            self._releasing = False
        self._arm(loop)

    def close(self, close: Callable[[], None]) -> None:
        loop = asyncio.get_running_loop()
        until = self.blocked_until(loop.time())
        if until <= loop.time():
            close()
        else:
            self._close, self._closer = close, loop.call_at(until, self.flush)

    def fail(self, error: BaseException) -> None:
        # The frames stay queued: they go out before the held-back close (see flush).
        for _, _, future in self._queue:
            if not future.done():
                future.set_exception(error)

    def heal(self) -> None:
        """Hold nothing from now on, and send what was held (the plan ends)."""
        self.windows.clear()
        self.delay = self.jitter = self.rate = 0.0
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._queue:
            for i, (_, write, future) in enumerate(self._queue):
                self._queue[i] = (0.0, write, future)
            self._release()
        self.flush()

    def flush(self) -> None:
        """Close the socket whose close was held, now, after what is still queued."""
        if self._closer is not None:
            self._closer.cancel()
        close, self._close, self._closer = self._close, None, None
        if close is not None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            while self._queue:
                with contextlib.suppress(Exception):
                    self._queue.popleft()[1]()
            close()


def _retrieve(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


def _chain(inner: asyncio.Future | None, outer: asyncio.Future) -> None:
    if inner is None:
        if not outer.done():
            outer.set_result(None)
        return

    def copy(done: asyncio.Future) -> None:
        if outer.done():
            return
        if done.cancelled():
            outer.cancel()
        elif (exc := done.exception()) is not None:
            outer.set_exception(exc)
        else:
            outer.set_result(done.result())

    inner.add_done_callback(copy)


class Injector:
    """A plan, installed: counts each rank's operations and makes its links' gates.

    Args:
        plan: what to do.
        processes: whether each rank is its own process (kill and pause by
            signals), or all are in this loop (by the engine's means).
    """

    def __init__(self, plan: FaultPlan, *, processes: bool) -> None:
        self.plan = plan
        self.processes = processes
        self.counts: dict[tuple[int, str], int] = {}
        self.killed: set[int] = set()
        self.fired: list[str] = []  #: the triggers that fired, in order ("kill 2 at all_reduce#3")
        self._gates: dict[tuple[int, int], LinkGate] = {}
        self._start: float | None = None
        self._triggered = [f for f in plan.faults if isinstance(f, (Kill, Pause))
                           or (isinstance(f, (Cut, Partition)) and f.at is not None)]  # fmt: skip
        self._paused_ranks = {f.rank for f in plan.faults if isinstance(f, Pause)} if not processes else set()
        self._timed: dict[tuple[int, int], list[tuple[float, float]]] = {}  # cuts' windows, from the start

    # -- operations ---------------------------------------------------------------------------

    def on_open(self, engine: Any, kind: str, seq: int, description: Description) -> None:
        """An operation opens on ``engine``'s rank (:data:`~asyncdist.engine.operation.ON_OPEN`)."""
        rank, op = engine.rank, description.op
        if rank in self.killed:
            raise RankKilled(rank, f"{op} after its death")
        if kind == "collective" and seq == 0:
            if self._start is None:  # the first world's startup barrier: "after" counts from here
                self._begin(asyncio.get_running_loop().time())
            return  # not one of the user's operations
        counts = self.counts
        counts[rank, op] = counts.get((rank, op), 0) + 1
        counts[rank, ANY] = counts.get((rank, ANY), 0) + 1
        for fault in self._triggered:
            at = fault.at
            assert at is not None
            if not (at.matches(op) and counts[rank, at.op] == at.count):
                continue
            if isinstance(fault, (Cut, Partition)):
                self._cut(rank, fault)
            elif fault.rank == rank:
                self.fired.append(str(fault))
                if isinstance(fault, Kill):
                    self._kill(engine, f"{op}#{counts[rank, op]}")
                else:
                    self._pause(engine, fault.seconds)

    def _cut(self, rank: int, fault: Cut | Partition) -> None:
        """``rank`` stops sending on the links ``fault`` cuts, from now."""
        now = asyncio.get_running_loop().time()
        for (src, dst), gate in self._gates.items():
            if src == rank and _cuts(fault, src, dst):
                gate.hold(now, now + fault.seconds)
        self.fired.append(f"{fault} (rank {rank})")

    def _kill(self, engine: Any, where: str) -> None:
        if self.processes:
            os.kill(os.getpid(), signal.SIGKILL)
        self.killed.add(engine.rank)
        engine.faults.crash()
        raise RankKilled(engine.rank, where)

    def _pause(self, engine: Any, seconds: float) -> None:
        if self.processes:
            # A stopped process cannot wake itself: a shell started now sends SIGCONT.
            # It stays in the rank's process group, which spawn kills at the end.
            subprocess.Popen(["/bin/sh", "-c", f"sleep {seconds:.6f}; kill -CONT {os.getpid()}"],
                             stdin=subprocess.DEVNULL)  # fmt: skip
            os.kill(os.getpid(), signal.SIGSTOP)
            return
        now = asyncio.get_running_loop().time()
        for (src, dst), gate in self._gates.items():
            if engine.rank in (src, dst):
                gate.hold(now, now + seconds)
        engine.stall(seconds)

    # -- links --------------------------------------------------------------------------------

    def gate(self, me: int, peer: int) -> LinkGate | None:
        """The gate of the connection from ``me`` to ``peer`` (:data:`~asyncdist.transport.injection.INJECTOR`)."""
        gate = LinkGate(me, peer, self.plan.seed)
        touched = bool(self._paused_ranks & {me, peer})
        for fault in self.plan.faults:
            if isinstance(fault, (Delay, Slow)) and (fault.link is None or set(fault.link) == {me, peer}):
                touched = True
                if isinstance(fault, Delay):
                    gate.delay += fault.seconds
                    gate.jitter += fault.jitter
                else:
                    gate.rate = min(gate.rate or fault.rate, fault.rate)
            elif isinstance(fault, (Cut, Partition)) and _cuts(fault, me, peer):
                touched = True
                if fault.at is None:
                    self._timed.setdefault((me, peer), []).append((fault.after, fault.after + fault.seconds))
        if not touched:
            return None
        self._gates[me, peer] = gate
        if self._start is not None:
            self._open_windows(gate)
        return gate

    def _begin(self, now: float) -> None:
        self._start = now
        for gate in self._gates.values():
            self._open_windows(gate)

    def _open_windows(self, gate: LinkGate) -> None:
        assert self._start is not None
        for start, end in self._timed.get((gate.src, gate.dst), ()):
            gate.hold(self._start + start, self._start + end)

    def refused(self, me: int, peer: int) -> bool:
        """Whether the dial between ``me`` and ``peer`` fails (a ``refuse`` of either)."""
        return any(isinstance(f, Refuse) and f.rank in (me, peer) for f in self.plan.faults)

    def heal(self) -> None:
        """End every hold now: what was held goes out, closes held back happen (loop thread)."""
        for gate in self._gates.values():
            gate.heal()


def _cuts(fault: Cut | Partition, a: int, b: int) -> bool:
    return set(fault.link) == {a, b} if isinstance(fault, Cut) else fault.splits(a, b)


_INSTALLED: list[Injector] = []


def install(plan: FaultPlan, *, processes: bool = False) -> Injector:
    """Install ``plan`` in this process (one at a time); returns its injector.

    Raises:
        RuntimeError: a plan is installed already.
    """
    if _INSTALLED:
        raise RuntimeError(f"a fault plan is installed already: {_INSTALLED[0].plan}")
    injector = Injector(plan, processes=processes)
    _INSTALLED.append(injector)
    operation.ON_OPEN = injector.on_open
    injection.INJECTOR = injector
    return injector


def uninstall() -> None:
    """Remove the installed plan, if any; sockets whose close it held are closed."""
    operation.ON_OPEN = None
    injection.INJECTOR = None
    while _INSTALLED:
        for gate in _INSTALLED.pop()._gates.values():
            gate.flush()


def note_plan(error: BaseException, plan: FaultPlan) -> None:
    """Note ``plan`` on ``error``, so that its traceback shows it (Python 3.11+)."""
    if hasattr(error, "add_note"):
        error.add_note(f"fault plan: {plan}")


def installed() -> Injector | None:
    """The injector of the installed plan, or None."""
    return _INSTALLED[0] if _INSTALLED else None

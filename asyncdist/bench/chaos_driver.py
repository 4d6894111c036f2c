"""One run of one path of the chaos benchmark (:mod:`asyncdist.bench.chaos`): its
workers started, SIGKILLed and replaced on a seeded schedule, told to stop,
and what happened collected from their events (:mod:`.chaos_cluster`).

:class:`Options` are the command line's flags; a run makes a :class:`Run`, with
one :class:`Kill` for each SIGKILL.
"""

from __future__ import annotations

import json
import queue
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from typing import Sequence

import numpy as np

from .chaos_cluster import Cluster, Worker
from .chaos_model import Model

__all__ = ["Options", "Kill", "Run", "run_path"]

#: Seconds a run waits past its end for its kills to be recovered from (``--settle``), then for its workers to finish.
_PATIENCE = 120.0


@dataclass
class Options:
    """What one chaos run does (the command line's flags)."""

    ranks: int = 8
    duration: float = 180.0  # seconds of training with faults, over all rounds
    rounds: int = 3  # the runs with and without faults alternate in this many parts each
    interval: float = 10.0
    kills: int | None = None  # at most this many kills per run (None: no limit)
    baseline: float | None = None  # the fault-free runs' wall time (None: ``duration``; 0: no such run)
    seed: int = 0
    settle: bool = False
    timeout: float = 10.0  # torchft: the Manager's (and so its process group's) timeout
    heartbeat_ms: int | None = None  # torchft: the lighthouse's heartbeat timeout (None: torchft's default)
    model: Model = field(default_factory=Model)


@dataclass
class Kill:
    """One SIGKILL, and the times after it (seconds; None: never happened)."""

    slot: int
    detection: float | None = None
    new_group: float | None = None
    recovery: float | None = None


@dataclass
class Run:
    """One run of one path: its rate, its kills and replacements, its final weights."""

    steps: int
    seconds: float
    kills: list[Kill]
    startups: list[float]
    admissions: list[float]
    weights: list[tuple[int, np.ndarray]]
    pids: list[int]

    @property
    def rate(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0

    @classmethod
    def joined(cls, parts: Sequence[Run]) -> Run:
        """The parts of one path's run (its rounds) as one run: their steps and seconds add up."""
        return cls(sum(p.steps for p in parts), sum(p.seconds for p in parts),
                   [k for p in parts for k in p.kills], [t for p in parts for t in p.startups],
                   [t for p in parts for t in p.admissions], [w for p in parts for w in p.weights],
                   [pid for p in parts for pid in p.pids])


class _Driver:
    """The event loop of one run: start, go, kill and replace on schedule, stop, collect."""

    def __init__(self, path: str, opts: Options, faults: bool) -> None:
        self.opts, self.faults = opts, faults
        self.cluster = Cluster(path, json.dumps(asdict(opts.model)), opts.timeout, opts.heartbeat_ms)
        self.members: set[Worker] = set()
        self.killed: set[Worker] = set()
        self.log: dict[Worker, list[tuple[str, float]]] = {}
        self.kills: list[tuple[float, Worker, set[Worker], Kill]] = []
        self.startups: list[float] = []
        self.admissions: list[float] = []
        self.joining: dict[Worker, float] = {}
        self.done: dict[Worker, tuple[int, float, str]] = {}
        self.waiting: set[Worker] = set()

    def run(self, duration: float) -> Run:
        opts = self.opts
        self.cluster.start(opts.ranks)
        ready = 0
        while ready < opts.ranks:
            if self._next(time.monotonic() + 300.0) == "ready":
                ready += 1
        self.cluster.tell_all("go")
        t0 = time.monotonic()
        rng = random.Random(opts.seed)
        next_kill, end = t0 + opts.interval / 2, t0 + duration
        last_slot, stop_at = -1, None
        while stop_at is None or not self._finished():
            now = time.monotonic()
            settled = not opts.settle or self._settled()
            # settled kills (--ci): the run goes on until each of its --kills happened
            owed = self.faults and opts.settle and opts.kills is not None and len(self.kills) < opts.kills
            if stop_at is None and now >= end and settled and not owed:
                self.cluster.tell_all("stop")
                stop_at = now
            elif stop_at is not None and now > stop_at + _PATIENCE:
                raise RuntimeError(f"{self.cluster.path}: the workers did not finish within {_PATIENCE:g} s of 'stop'")
            elif stop_at is None and now > end + _PATIENCE:
                raise RuntimeError(f"{self.cluster.path}: {self._unsettled()}, {_PATIENCE:g} s after the run's end")
            if (self.faults and stop_at is None and now >= next_kill and settled and len(self.members) >= 2
                    and (opts.kills is None or len(self.kills) < opts.kills)):
                last_slot = self._kill(rng, last_slot)
                next_kill = max(next_kill + opts.interval, now)
            deadlines = [t for t in (end, next_kill if self.faults else end) if t > now and stop_at is None]
            self._next(min([*deadlines, now + 0.5]))
        t_end = min(t for _, t, _ in self.done.values())
        weights = [(steps, np.load(out)) for steps, _, out in self.done.values()]
        return Run(max(steps for steps, _ in weights), t_end - t0, [k for *_, k in self._measured()],
                   self.startups, self.admissions, weights, [w.proc.pid for w in self.cluster.workers])

    def _kill(self, rng: random.Random, last_slot: int) -> int:
        choices = sorted(self.members, key=lambda w: w.slot)
        victim = rng.choice([w for w in choices if w.slot != last_slot] or choices)
        sent = self.cluster.kill(victim)
        self.members.discard(victim)
        self.killed.add(victim)
        self.kills.append((sent, victim, set(self.members), Kill(victim.slot)))
        self.waiting.add(self.cluster.replace(victim))
        return victim.slot

    def _next(self, until: float) -> str:
        """Handle the next event, if one comes before ``until``; its name, or "" if none came."""
        try:
            ev = self.cluster.events.get(timeout=max(0.0, until - time.monotonic()))
        except queue.Empty:
            return ""
        w, name = ev.worker, ev.name
        self.log.setdefault(w, []).append((name, ev.t))
        if name in ("ready", "admitted"):
            self.members.add(w)
            if name == "admitted":
                self.waiting.discard(w)
                self.admissions.append(ev.t - self.joining.get(w, w.started))
        elif name == "joining":
            self.joining[w] = ev.t
            self.startups.append(ev.t - w.started)
            self.cluster.announce()
        elif name == "done":
            self.done[w] = (int(ev.fields["steps"]), ev.t, str(ev.fields["out"]))
        elif name == "exit" and w not in self.killed and w not in self.done and w.proc.returncode != -9:
            raise RuntimeError(f"{self.cluster.path}: worker pid {w.proc.pid} (slot {w.slot}) exited with code "
                               f"{ev.fields['code']} before it finished:\n{self.cluster.log_tail(w)}")
        return name

    def _finished(self) -> bool:
        return all(w in self.done for w in self.members)

    def _first(self, w: Worker, name: str, after: float) -> float | None:
        return next((t for n, t in self.log.get(w, []) if n == name and t > after), None)

    def _measured(self) -> list[tuple[float, Worker, set[Worker], Kill]]:
        """Each kill with its times filled in, from the survivors' events."""
        for sent, _, survivors, kill in self.kills:
            alive = [w for w in survivors if w not in self.killed or self._first(w, "recovered", sent)]
            failed = [t for w in alive if (t := self._first(w, "failed", sent)) is not None]
            kill.detection = min(failed) - sent if failed else None
            kill.new_group = self._last(alive, "shrunk", sent)
            kill.recovery = self._last(alive, "recovered", sent)
        return self.kills

    def _last(self, workers: list[Worker], name: str, sent: float) -> float | None:
        """Seconds from ``sent`` to the last of ``workers``' first ``name`` after it; None if one has none yet."""
        times = [self._first(w, name, sent) for w in workers]
        found = [t for t in times if t is not None]
        return max(found) - sent if found and len(found) == len(times) else None

    def _settled(self) -> bool:
        """Every kill so far recovered from, and every replacement admitted."""
        return not self.waiting and all(k.recovery is not None for *_, k in self._measured())

    def _unsettled(self) -> str:
        """What the run still waits for, in words."""
        lost = [f"slot {k.slot}" for *_, k in self._measured() if k.recovery is None]
        waits = ([f"the kill of {', '.join(lost)} not recovered from"] if lost else []) + (
            [f"{len(self.waiting)} replacement(s) not admitted"] if self.waiting else [])
        return " and ".join(waits)

    def close(self) -> None:
        self.cluster.close()
        shutil.rmtree(self.cluster.folder, ignore_errors=True)


def run_path(path: str, opts: Options, faults: bool, duration: float) -> Run:
    """One run of ``path`` for ``duration`` seconds; every process it started is killed and reaped before it returns.

    Raises:
        RuntimeError: a worker exited before it finished, or the run did not end.
    """
    driver = _Driver(path, opts, faults)
    try:
        return driver.run(duration)
    finally:
        driver.close()

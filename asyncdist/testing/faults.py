"""Fault plans: what goes wrong in a test, as plain seeded data that reads as one line.

A :class:`FaultPlan` is a tuple of faults and a seed. Its text form is what a
test writes and what a failure prints, and ``FaultPlan.parse(str(plan)) == plan``::

    seed 7; kill 2 at all_reduce#3; delay 0-1 5ms~2ms; cut 1-3 after 200ms for 2s

| text | what |
|---|---|
| ``kill R at OP#K`` | rank R dies (SIGKILL) as it starts its K-th ``OP`` |
| ``pause R at OP#K for T`` | rank R stops (SIGSTOP) for T seconds as it starts it |
| ``delay A-B D``, ``delay * D~J`` | frames on link A-B (``*``: every link) leave D later, plus up to J (seeded) |
| ``slow A-B RATE`` | link A-B carries RATE bytes per second (``10MB/s``) |
| ``cut A-B [at OP#K, after S] for T`` | link A-B carries nothing for T seconds, then heals |
| ``partition SIDES [at OP#K] for T`` | no link between two sets of ranks carries anything for T seconds |
| ``refuse R`` | rank R's connections at init fail |

SIDES are sets of ranks joined by bars: ``0,1|2,3``. ``OP`` is an operation's
name as the flight recorder writes it (``all_reduce``, ``barrier``, ``send``,
``recv``, ...) or ``any``; K counts from 1, per rank, from
the moment the plan is installed (the world's startup barrier is not counted).
Durations take ``us``, ``ms`` or ``s``; rates ``B/s``, ``KB/s``, ``MB/s``, ``GB/s``
(powers of 1000). A cut or partition starts as each rank of a link starts its
K-th ``OP`` (``at OP#K``: each stops sending to the other then), or ``after S``
seconds counted from each rank's startup barrier (default: at once).

This module is data only: parsing, printing and drawing plans from a seed.
Applying one is :mod:`.injector`'s job.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence, Union

from ..errors import InvalidArgumentError

__all__ = [
    "Kill", "Pause", "Delay", "Slow", "Cut", "Partition", "Refuse", "Fault", "FaultPlan", "KINDS", "Trigger", "plans",
]  # fmt: skip

ANY = "any"


@dataclass(frozen=True)
class Trigger:
    """A rank's ``count``-th operation named ``op`` (``any``: of any name), counted from 1."""

    op: str
    count: int

    def __str__(self) -> str:
        return f"{self.op}#{self.count}"

    def matches(self, op: str) -> bool:
        """Whether an operation named ``op`` counts toward this trigger."""
        return self.op == ANY or self.op == op


@dataclass(frozen=True)
class Kill:
    """Rank ``rank`` dies as under SIGKILL as it starts the operation ``at``."""

    rank: int
    at: Trigger

    def __str__(self) -> str:
        return f"kill {self.rank} at {self.at}"


@dataclass(frozen=True)
class Pause:
    """Rank ``rank`` stops as under SIGSTOP for ``seconds`` as it starts the operation ``at``."""

    rank: int
    at: Trigger
    seconds: float

    def __str__(self) -> str:
        return f"pause {self.rank} at {self.at} for {_duration(self.seconds)}"


@dataclass(frozen=True)
class Delay:
    """Frames on ``link`` (None: every link) leave ``seconds`` later, plus up to ``jitter`` from the seed."""

    link: tuple[int, int] | None
    seconds: float
    jitter: float = 0.0

    def __str__(self) -> str:
        jitter = f"~{_duration(self.jitter)}" if self.jitter else ""
        return f"delay {_link(self.link)} {_duration(self.seconds)}{jitter}"


@dataclass(frozen=True)
class Slow:
    """``link`` (None: every link) carries ``rate`` bytes per second, each way."""

    link: tuple[int, int] | None
    rate: float

    def __str__(self) -> str:
        return f"slow {_link(self.link)} {_rate(self.rate)}"


@dataclass(frozen=True)
class Cut:
    """``link`` carries nothing, either way, for ``seconds``; then it heals.

    It starts ``after`` seconds from the start, or, with ``at``, as each of its
    two ranks starts that operation (each stops sending to the other then).
    """

    link: tuple[int, int]
    seconds: float
    after: float = 0.0
    at: Trigger | None = None

    def __str__(self) -> str:
        return f"cut {_link(self.link)}{_when(self.after, self.at)} for {_duration(self.seconds)}"


@dataclass(frozen=True)
class Partition:
    """No link between two of ``sides`` carries anything for ``seconds`` (started as a :class:`Cut`)."""

    sides: tuple[tuple[int, ...], ...]
    seconds: float
    after: float = 0.0
    at: Trigger | None = None

    def __str__(self) -> str:
        sides = "|".join(",".join(map(str, side)) for side in self.sides)
        return f"partition {sides}{_when(self.after, self.at)} for {_duration(self.seconds)}"

    def splits(self, a: int, b: int) -> bool:
        """Whether ranks ``a`` and ``b`` are on different sides (a rank on no side is on none)."""
        side_a = next((i for i, side in enumerate(self.sides) if a in side), None)
        side_b = next((i for i, side in enumerate(self.sides) if b in side), None)
        return side_a is not None and side_b is not None and side_a != side_b


@dataclass(frozen=True)
class Refuse:
    """Rank ``rank``'s connections at init fail (it dials nobody, nobody dials it)."""

    rank: int

    def __str__(self) -> str:
        return f"refuse {self.rank}"


Fault = Union[Kill, Pause, Delay, Slow, Cut, Partition, Refuse]
#: Every kind of fault, by the word that starts it.
KINDS: dict[str, type] = {
    "kill": Kill, "pause": Pause, "delay": Delay, "slow": Slow, "cut": Cut, "partition": Partition, "refuse": Refuse,
}  # fmt: skip


@dataclass(frozen=True)
class FaultPlan:
    """A test's faults, and the seed that drew them or drives their jitter.

    Attributes:
        faults: what happens, in the order written.
        seed: the seed of :meth:`random` or of the delays' jitter (None: none given; jitter then uses 0).
    """

    faults: tuple[Fault, ...] = ()
    seed: int | None = field(default=None)

    def __str__(self) -> str:
        parts = ([] if self.seed is None else [f"seed {self.seed}"]) + [str(f) for f in self.faults]
        return "; ".join(parts)

    def __bool__(self) -> bool:
        return bool(self.faults)

    @property
    def kills(self) -> frozenset[int]:
        """The ranks this plan kills."""
        return frozenset(f.rank for f in self.faults if isinstance(f, Kill))

    @classmethod
    def of(cls, plan: FaultPlan | str | None) -> FaultPlan:
        """``plan`` as a FaultPlan: parsed if text, empty if None."""
        if plan is None:
            return cls()
        return plan if isinstance(plan, FaultPlan) else cls.parse(plan)

    @classmethod
    def parse(cls, text: str) -> FaultPlan:
        """The plan ``text`` says (see the module doc for the grammar).

        Raises:
            InvalidArgumentError: a clause that is not one of the kinds, naming it.
        """
        faults: list[Fault] = []
        seed: int | None = None
        for clause in (c.strip() for c in text.split(";")):
            if not clause:
                continue
            words = clause.split()
            try:
                if words[0] == "seed" and len(words) == 2:
                    seed = int(words[1])
                else:
                    faults.append(_parse_fault(words))
            except (ValueError, IndexError, KeyError) as exc:
                raise InvalidArgumentError(f"fault plan: cannot read {clause!r} ({exc})") from None
        return cls(tuple(faults), seed)

    @classmethod
    def random(
        cls,
        seed: int,
        ranks: int,
        kinds: Iterable[str] = ("kill",),
        *,
        ops: Sequence[str] = (ANY,),
        max_count: int = 8,
        count: int = 1,
        max_seconds: float = 0.5,
        spare: Iterable[int] = (0,),
    ) -> FaultPlan:
        """Draw a plan of ``count`` faults among ``kinds`` for ``ranks`` ranks from ``seed``.

        The same arguments always give the same plan. Durations are whole
        milliseconds up to ``max_seconds``; triggers count up to ``max_count``
        operations named one of ``ops``; no fault kills, pauses or refuses a rank
        of ``spare`` (rank 0 by default, which a test usually reads its results from).

        Raises:
            InvalidArgumentError: an unknown kind, or too few ranks for one.
        """
        kinds = list(kinds)
        unknown = [k for k in kinds if k not in KINDS]
        if unknown or not kinds:
            raise InvalidArgumentError(f"fault kinds must be among {sorted(KINDS)}, got {kinds!r}")
        if ranks < 2:
            raise InvalidArgumentError(f"a random fault plan needs at least 2 ranks, got {ranks}")
        rng = random.Random(seed)
        victims = [r for r in range(ranks) if r not in set(spare)] or list(range(ranks))
        return cls(tuple(_draw(rng, rng.choice(kinds), ranks, victims, ops, max_count, max_seconds)
                         for _ in range(count)), seed)  # fmt: skip


def plans(ranks: int, kinds: Iterable[str] = ("kill",), **options: Any) -> Any:
    """A Hypothesis strategy of :meth:`FaultPlan.random` plans (``options`` as there);
    it draws, and shrinks, the seed. Needs ``hypothesis``."""
    from hypothesis import strategies as st

    kinds = tuple(kinds)
    return st.integers(0, 2**32 - 1).map(lambda seed: FaultPlan.random(seed, ranks, kinds, **options))


def _draw(rng: random.Random, kind: str, ranks: int, victims: list[int], ops: Sequence[str],
          max_count: int, max_seconds: float) -> Fault:  # fmt: skip
    def seconds() -> float:
        return rng.randint(1, max(1, round(max_seconds * 1000))) / 1000

    def trigger() -> Trigger:
        return Trigger(rng.choice(list(ops)), rng.randint(1, max_count))

    def link() -> tuple[int, int]:
        a, b = rng.sample(range(ranks), 2)
        return (min(a, b), max(a, b))

    if kind == "kill":
        return Kill(rng.choice(victims), trigger())
    if kind == "pause":
        return Pause(rng.choice(victims), trigger(), seconds())
    if kind == "delay":
        tenth = max(1, round(max_seconds * 100))  # whole milliseconds, up to a tenth of max_seconds
        return Delay(link(), rng.randint(1, tenth) / 1000, rng.randint(0, tenth) / 1000)
    if kind == "slow":
        return Slow(link(), float(rng.choice((1, 10, 100))) * 1e6)
    if kind == "cut":
        return Cut(link(), seconds(), at=trigger())
    if kind == "partition":
        members = list(range(ranks))
        rng.shuffle(members)
        k = rng.randint(1, ranks - 1)
        return Partition((tuple(sorted(members[:k])), tuple(sorted(members[k:]))), seconds(), at=trigger())
    return Refuse(rng.choice(victims))


# -- text ----------------------------------------------------------------------------------

_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
_RATES = {"GB/s": 1e9, "MB/s": 1e6, "KB/s": 1e3, "B/s": 1.0}


def _duration(seconds: float) -> str:
    for unit in ("s", "ms", "us"):
        value = seconds / _UNITS[unit]
        if value >= 1 or unit == "us":
            text = f"{value:.12g}{unit}"
            if _seconds(text) == seconds:
                return text
    return f"{seconds!r}s"


def _seconds(text: str) -> float:
    match = re.fullmatch(r"([0-9.e+-]+)(us|ms|s)", text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration such as 5ms or 2s")
    value = float(match[1]) * _UNITS[match[2]]
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"{text!r} is not a duration >= 0")
    return value


def _rate(rate: float) -> str:
    for unit, scale in _RATES.items():
        if rate >= scale and float(f"{rate / scale:.12g}") * scale == rate:
            return f"{rate / scale:.12g}{unit}"
    return f"{rate!r}B/s"


def _parse_rate(text: str) -> float:
    for unit, scale in _RATES.items():
        if text.endswith(unit) and text[: -len(unit)]:
            rate = float(text[: -len(unit)]) * scale
            if rate > 0:
                return rate
    raise ValueError(f"{text!r} is not a rate such as 10MB/s")


def _link(link: tuple[int, int] | None) -> str:
    return "*" if link is None else f"{link[0]}-{link[1]}"


def _parse_link(text: str, *, every: bool) -> tuple[int, int] | None:
    if text == "*" and every:
        return None
    a, b = (_rank(part) for part in text.split("-"))
    if a == b:
        raise ValueError(f"link {text!r} joins a rank to itself")
    return (min(a, b), max(a, b))


def _rank(text: str) -> int:
    rank = int(text)
    if rank < 0:
        raise ValueError(f"rank {rank} is negative")
    return rank


def _when(after: float, at: Trigger | None) -> str:
    return f" at {at}" if at is not None else f" after {_duration(after)}" if after else ""


def _trigger(text: str) -> Trigger:
    op, _, count = text.partition("#")
    if not re.fullmatch(r"[a-z_0-9]+", op) or not count.isdigit() or int(count) < 1:
        raise ValueError(f"{text!r} is not an operation such as all_reduce#3 or any#5")
    return Trigger(op, int(count))


def _timed(words: list[str]) -> tuple[float, float, Trigger | None]:
    """``[after S | at OP#K] for T`` → (T, S, trigger)."""
    after, at = 0.0, None
    if words[:1] == ["after"]:
        after, words = _seconds(words[1]), words[2:]
    elif words[:1] == ["at"]:
        at, words = _trigger(words[1]), words[2:]
    if len(words) != 2 or words[0] != "for":
        raise ValueError("expected 'for T' (and 'after S' or 'at OP#K' before it)")
    return _seconds(words[1]), after, at


def _parse_fault(words: list[str]) -> Fault:
    kind, args = words[0], words[1:]
    if kind == "kill" and len(args) == 3 and args[1] == "at":
        return Kill(_rank(args[0]), _trigger(args[2]))
    if kind == "pause" and len(args) == 5 and args[1] == "at" and args[3] == "for":
        return Pause(_rank(args[0]), _trigger(args[2]), _seconds(args[4]))
    if kind == "delay" and len(args) == 2:
        fixed, _, jitter = args[1].partition("~")
        return Delay(_parse_link(args[0], every=True), _seconds(fixed), _seconds(jitter) if jitter else 0.0)
    if kind == "slow" and len(args) == 2:
        return Slow(_parse_link(args[0], every=True), _parse_rate(args[1]))
    if kind == "cut" and args:
        link = _parse_link(args[0], every=False)
        assert link is not None
        return Cut(link, *_timed(args[1:]))
    if kind == "partition" and args:
        sides = tuple(tuple(sorted(_rank(r) for r in side.split(","))) for side in args[0].split("|"))
        if len(sides) < 2 or len({r for side in sides for r in side}) != sum(map(len, sides)):
            raise ValueError("a partition needs two or more sets of distinct ranks, such as 0,1|2,3")
        return Partition(sides, *_timed(args[1:]))
    if kind == "refuse" and len(args) == 1:
        return Refuse(_rank(args[0]))
    raise KeyError(f"not a fault: expected one of {', '.join(KINDS)} as in the asyncdist.testing.faults docs")

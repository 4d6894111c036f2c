"""Reading a folder of flight-recorder dumps into one :class:`Trace`.

Every rank writes ``asyncdist-trace-rank<R>.json``; a job's folder holds one
per rank that could write (a rank that died wrote none). Times in a dump are
its rank's monotonic clock; :meth:`Dump.wall` turns them into wall-clock
seconds with the pair (``wall_time``, ``clock_time``) the dump was written
with, so that ranks on different hosts line up as well as their clocks do.

Dumps of format version 1 and 2 read alike; version 2 adds each thread's
stacks (:attr:`Dump.stacks`, empty for version 1).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InvalidArgumentError

__all__ = ["Dump", "Trace", "load"]

_PATTERN = "asyncdist-trace-rank*.json"


@dataclass
class Dump:
    """One rank's dump: its fields as written, entries oldest first."""

    rank: int
    data: dict[str, Any]

    @property
    def entries(self) -> list[dict[str, Any]]:
        return self.data["entries"]

    @property
    def stacks(self) -> list[dict[str, Any]]:
        """The stack captures it kept, oldest first (:func:`~asyncdist.flight.stacks.capture`); none in version 1."""
        return self.data.get("stacks") or []

    def wall(self, clock: float) -> float:
        """Wall-clock seconds of a time in this rank's record."""
        return clock - self.data["clock_time"] + self.data["wall_time"]


@dataclass
class Trace:
    """Every rank's dump of one job.

    Attributes:
        dumps: by global rank.
        world_size: as the dumps say (the largest, should they differ).
    """

    dumps: dict[int, Dump] = field(default_factory=dict)
    world_size: int = 0

    @property
    def missing(self) -> list[int]:
        """Ranks that left no dump."""
        return [rank for rank in range(self.world_size) if rank not in self.dumps]


def load(folder: str | Path) -> Trace:
    """Read every dump in ``folder`` (or one dump file).

    Raises:
        InvalidArgumentError: no dump there, or a file that is not one.
    """
    path = Path(folder)
    files = [path] if path.is_file() else sorted(path.glob(_PATTERN))
    if not files:
        raise InvalidArgumentError(f"no flight-recorder dumps ({_PATTERN}) in {str(path)!r}")
    trace = Trace()
    for file in files:
        try:
            data = json.loads(file.read_text())
        except (OSError, ValueError) as exc:
            raise InvalidArgumentError(f"{str(file)!r} is not a readable flight-recorder dump: {exc}") from None
        if not isinstance(data, dict) or data.get("format") != "asyncdist-trace":
            raise InvalidArgumentError(f"{str(file)!r} is not a flight-recorder dump (no 'format': 'asyncdist-trace')")
        trace.dumps[data["rank"]] = Dump(data["rank"], data)
        trace.world_size = max(trace.world_size, data["world_size"])
    return trace

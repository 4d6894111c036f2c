"""The live progress line of a sweep: which job of how many a series is on.

A default sweep runs for minutes per series and prints nothing until its
tables, so rank 0 of each series rewrites one line on stderr (``\\r``, no
newline) as it starts each job, and clears it at the end. It is on only
where someone watches: the parent turns it on (:attr:`Plan.progress
<asyncdist.bench.plan.Plan.progress>`) when its stderr is a terminal, so
logs and pipes get no carriage returns.
"""

from __future__ import annotations

import sys
from typing import TextIO

from .plan import Job, format_bytes

__all__ = ["Progress"]


class Progress:
    """Writes ``\\r  [i/n] op size`` for each job, then clears the line.

    Args:
        total: jobs in the series.
        enabled: write at all (rank 0 of a plan with ``progress`` on).
        stream: where to (default: stderr at the time of writing).
    """

    def __init__(self, total: int, enabled: bool, stream: TextIO | None = None) -> None:
        self.total, self.enabled, self.stream = total, enabled, stream
        self._width = 0

    def _write(self, text: str) -> None:
        stream = self.stream or sys.stderr
        stream.write("\r" + text.ljust(self._width))
        stream.flush()
        self._width = len(text)

    def job(self, index: int, job: Job, nbytes: int) -> None:
        """Job ``index`` (0-based) starts; ``nbytes`` is its size (0: unsized)."""
        if self.enabled:
            size = f" {format_bytes(nbytes)}" if nbytes else ""
            self._write(f"  [{index + 1}/{self.total}] {job.op}{size}")

    def done(self) -> None:
        """Clear the line (the tables come next)."""
        if self.enabled and self._width:
            self._write("")
            (self.stream or sys.stderr).write("\r")
            self._width = 0

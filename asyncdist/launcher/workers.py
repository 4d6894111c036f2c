"""A worker of the launcher as the supervisor sees it: its output, its exit, its blame.

:class:`WorkerProtocol` copies a worker's lines to the console behind its
prefix (and to its log files), keeps the last lines of its stderr and notes
when it first showed a traceback and whether it relays a peer's failure;
:class:`Worker` describes its exit; :func:`blame` picks, among the workers
that failed, the one that failed first. :mod:`.supervisor` starts, watches
and stops them.
"""

from __future__ import annotations

import asyncio
import collections
import signal
from dataclasses import dataclass
from typing import BinaryIO, cast

__all__ = ["Console", "Worker", "WorkerProtocol", "blame", "signal_name", "summary", "continuing_failure",
           "never_admitted"]

_TAIL_LINES = 10  # lines of a failed worker's stderr that the launcher repeats
_RELAYED = (b"PeerLostError", b"OperationTimeoutError")  # errors that name another rank's failure


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class Console:
    """Where workers' lines go; a closed console (``| head``) stops the printing, not the job."""

    def __init__(self, sink: BinaryIO) -> None:
        self._sink: BinaryIO | None = sink

    def write(self, data: bytes) -> None:
        if self._sink is None:
            return
        try:
            self._sink.write(data)
            self._sink.flush()
        except (BrokenPipeError, ValueError):
            self._sink = None


class WorkerProtocol(asyncio.SubprocessProtocol):
    """One worker's pipes and exit, seen from the loop.

    ``exited`` resolves with the exit code as soon as the process is reaped,
    even while a child it left behind still holds its pipes (asyncio's
    ``Process.wait`` would wait for those pipes too); ``closed`` resolves once
    the pipes are closed as well. Output is copied line by line behind
    ``prefix`` to the consoles (None for a stream that is filtered out or
    redirected), and as it comes to the stream's log file, if it has one.
    """

    def __init__(self, prefix: bytes, consoles: tuple[Console | None, Console | None],
                 files: dict[int, BinaryIO] | None = None) -> None:
        loop = asyncio.get_running_loop()
        self.exited: asyncio.Future[int] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        self.transport: asyncio.SubprocessTransport | None = None
        self._prefix = prefix
        self._consoles = consoles
        self._files = files or {}
        self._partial = {1: b"", 2: b""}
        self.tail: collections.deque[bytes] = collections.deque(maxlen=_TAIL_LINES)  # stderr's last lines
        self.error_at: float | None = None  # loop time of its first traceback on stderr
        # Its stderr relays a peer's failure: a PeerLostError, or an
        # OperationTimeoutError (it waited for a peer in vain: a victim too).
        self.relays = False
        self.not_admitted = False  # a replacement's stderr says it was never admitted (JoinClosedError)
        self.exit_at = 0.0  # loop time of its exit

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # asyncio types this hook for every kind of protocol; a subprocess
        # protocol's transport is a SubprocessTransport in behaviour (uvloop's
        # does not subclass it, so isinstance cannot check it).
        self.transport = cast(asyncio.SubprocessTransport, transport)

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        file = self._files.get(fd)
        if file is not None:
            file.write(data)
            file.flush()
        *lines, self._partial[fd] = (self._partial[fd] + data).split(b"\n")
        if fd == 2:
            self._note_errors(lines)
        console = self._consoles[fd - 1]
        if lines and console is not None:
            console.write(b"".join(self._prefix + line + b"\n" for line in lines))

    def _note_errors(self, lines: list[bytes]) -> None:
        """Keep stderr's last lines, when it first showed a traceback, and whether it relays a peer's failure."""
        for line in lines:
            if self.error_at is None and line.startswith(b"Traceback"):
                self.error_at = asyncio.get_running_loop().time()
            if any(name in line for name in _RELAYED):
                self.relays = True
            if b"JoinClosedError" in line:
                self.not_admitted = True
        self.tail.extend(lines)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        rest, self._partial[fd] = self._partial.get(fd, b""), b""
        if rest and fd == 2:
            self._note_errors([rest])
        console = self._consoles[fd - 1] if fd in (1, 2) else None
        if rest and console is not None:  # a last line without its newline
            console.write(self._prefix + rest + b"\n")
        file = self._files.pop(fd, None)
        if file is not None:
            file.close()

    def process_exited(self) -> None:
        assert self.transport is not None
        code = self.transport.get_returncode()
        if not self.exited.done() and code is not None:
            self.exit_at = asyncio.get_running_loop().time()
            self.exited.set_result(code)

    def connection_lost(self, exc: Exception | None) -> None:
        for file in self._files.values():
            file.close()
        self._files.clear()
        if not self.closed.done():
            self.closed.set_result(None)


@dataclass(slots=True)
class Worker:
    """A started worker; ``replacement``: 0, or N for the N-th replacement (``--replace``)."""

    local_rank: int
    rank: int
    pid: int
    protocol: WorkerProtocol
    replacement: int = 0

    @property
    def name(self) -> str:
        """``rank 3``, or ``replacement 1`` (whose rank the launcher does not know)."""
        return f"replacement {self.replacement}" if self.replacement else f"rank {self.rank}"

    def describe_exit(self) -> str:
        code = self.protocol.exited.result()
        killed = f", {signal_name(-code)}" if code < 0 else ""
        return (f"worker {self.name} exited with code {code} "
                f"(local rank {self.local_rank}, pid {self.pid}{killed})")

    def stderr_tail(self) -> str:
        """Its last lines on stderr, indented, for the launcher's report."""
        return "".join(f"\n    {line.decode(errors='replace')}" for line in self.protocol.tail)


def blame(failed: list[Worker], workers: list[Worker]) -> Worker:
    """The worker that failed first, given the ones that exited non-zero, in order.

    A rank that fails makes its peers fail a moment later with a
    PeerLostError that names it (or time out waiting for it), and a peer may
    exit before it (the failing rank still runs its exit hooks). So the first
    to fail is the first to exit non-zero without relaying a peer's error,
    else the first whose stderr showed a traceback that relays none, else the
    first to exit non-zero.
    """
    for worker in failed:
        if not worker.protocol.relays:
            return worker
    raised = [w for w in workers if w.protocol.error_at is not None and not w.protocol.relays]
    if raised:
        return min(raised, key=lambda w: w.protocol.error_at or 0.0)
    return failed[0]


def never_admitted(worker: Worker) -> bool:
    """A replacement that gave up waiting to join because the job ended (JoinClosedError)."""
    return bool(worker.replacement) and worker.protocol.exited.result() != 0 and worker.protocol.not_admitted


def summary(workers: list[Worker]) -> str:
    """The launcher's last line under ``--on-failure continue``: who finished, who
    died and how, and (if any) the replacements that were never admitted."""
    finished = [w.name for w in workers if w.protocol.exited.result() == 0]
    died = []
    for w in sorted((w for w in workers if w.protocol.exited.result() != 0 and not never_admitted(w)),
                    key=lambda w: w.protocol.exit_at):
        code = w.protocol.exited.result()
        died.append(f"{w.name} ({signal_name(-code) if code < 0 else f'exit code {code}'})")
    line = f"asyncdist-run: finished: {', '.join(finished) or 'none'}; died: {', '.join(died) or 'none'}"
    idle = [w.name for w in workers if never_admitted(w)]
    if idle:
        line += f"; never admitted (the job ended before a grow): {', '.join(idle)}"
    return line


def continuing_failure(workers: list[Worker]) -> Worker | None:
    """Under ``--on-failure continue``, the worker that failed the job, or None if it succeeded.

    A worker killed by a signal is the loss the job was meant to survive; one
    that exited with an error code of its own (an exception) failed the job,
    and so did every worker dying: the job succeeded when at least one
    worker finished and none exited with an error code. A replacement never
    admitted did no part of the job: its exit counts for nothing.
    """
    by_exit = sorted((w for w in workers if not never_admitted(w)), key=lambda w: w.protocol.exit_at)
    errors = [w for w in by_exit if w.protocol.exited.result() > 0]
    if errors:
        return errors[0]
    if not any(w.protocol.exited.result() == 0 for w in workers):
        return by_exit[0]
    return None

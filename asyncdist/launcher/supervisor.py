"""Run one node's worker group: start it, relay its output, watch it, stop it, restart it.

The whole supervision is one asyncio program on the launcher's main thread.
Each worker's pipes feed a protocol that copies its lines to the console
behind the worker's prefix and reports its exit the moment it is reaped;
the first exit or signal that matters decides the attempt:

* every worker exited with code 0: the job succeeded;
* a worker exited with another code: the others get SIGTERM, then SIGKILL
  after ``--shutdown-timeout`` s; the group is started again while
  ``--max-restarts`` allows (after :meth:`~.job.Job.begin_attempt` has made
  the stores ready for it), else the launcher exits 1 (as torchrun does);
* under ``--on-failure continue`` a worker that fails is reported and the
  others go on (a replacement is started in its place while ``--replace``
  allows, to rejoin the job; once no rank is left to admit the replacements
  still waiting, :mod:`.waiting_room` tells them so, and they exit); the
  attempt ends when every worker has exited,
  with a summary of who finished and who died (:func:`~.workers.summary`);
  it failed if a worker exited with an error code of its own or none finished
  (:func:`~.workers.continuing_failure`);
* the launcher got SIGINT, SIGTERM or SIGHUP: the same signal goes to every
  worker (SIGINT gives Python workers a KeyboardInterrupt and its traceback),
  SIGKILL follows after the timeout or at once on a second signal, and the
  launcher exits 128 + the signal number, without restarting.

No process outlives the launcher: each worker leads its own process group
(``start_new_session``), signals go to the whole group, so the worker's own
children go too, and every group gets a final SIGKILL when its attempt
ends. On Linux each worker also asks the kernel to SIGKILL it if the
launcher dies (``PR_SET_PDEATHSIG``), which covers a launcher killed with
SIGKILL, where no clean-up code runs.

This module owns processes and pipes; what a worker is told (environment,
arguments, prefix) comes from :class:`~.job.Job`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from typing import BinaryIO, Callable, cast

from . import traces, waiting_room
from .job import Job, LaunchError
from .workers import Console, Worker, WorkerProtocol, blame, continuing_failure, never_admitted, signal_name, summary
from .gathering import report_gathering
from .stores import JOIN_TIMEOUT

__all__ = ["run_job", "FAILURE_EXIT_CODE"]

#: The launcher's exit code when a worker failed (torchrun's, for its ChildFailedError).
FAILURE_EXIT_CODE = 1
_HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_DRAIN_SECONDS = 5.0  # how long output still in the pipes may take to arrive after the group ended
# Seconds a failure that relays a peer's (PeerLostError, OperationTimeoutError)
# waits for the failing peer's own exit, so that the launcher names the rank
# that failed first, and the other victims write their dumps before the stop.
_SETTLE_SECONDS = 2.0
_LAST_WORDS_SECONDS = 0.2  # how long a failed worker's stderr is read on after its exit, at most
_READY_SLICE = 1.0  # seconds per wait for node 0's next attempt, between looks at the signals
_PR_SET_PDEATHSIG = 1


def _die_with_launcher() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the kernel SIGKILL the worker when the launcher dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here, not in the forked child
    except (OSError, AttributeError):
        return None
    launcher = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != launcher:  # the launcher died before prctl took effect
            os._exit(1)

    return preexec


def _killpg(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


class _Signals:
    """The signals the launcher received, and a way to wait for the next one."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self._waiters: list[asyncio.Future[None]] = []

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        for signum in _HANDLED_SIGNALS:
            loop.add_signal_handler(signum, self._on_signal, signum)

    def uninstall(self, loop: asyncio.AbstractEventLoop) -> None:
        for signum in _HANDLED_SIGNALS:
            loop.remove_signal_handler(signum)

    def _on_signal(self, signum: int) -> None:
        self.received.append(signum)
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def wait_beyond(self, count: int) -> None:
        """Return once more than ``count`` signals have been received."""
        while len(self.received) <= count:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter


async def _start(job: Job, local_rank: int, restart_count: int, consoles: tuple[Console, Console],
                 replacement: int = 0) -> Worker:
    argv = job.worker_argv(local_rank)
    out_shown, err_shown = job.to_console(local_rank)
    try:
        files = {fd: cast(BinaryIO, open(path, "ab")) for fd, path in job.log_files(local_rank, restart_count).items()}
    except OSError as exc:
        raise LaunchError(f"cannot write the log files of local rank {local_rank}: {exc}") from exc
    protocol = WorkerProtocol(job.prefix(local_rank, replacement), (consoles[0] if out_shown else None,
                                                        consoles[1] if err_shown else None), files)
    try:
        transport, _ = await asyncio.get_running_loop().subprocess_exec(
            lambda: protocol,
            *argv,
            env=job.worker_env(local_rank, restart_count, replacement),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=_die_with_launcher(),
        )
    except OSError as exc:
        for file in files.values():
            file.close()
        raise LaunchError(f"cannot start local rank {local_rank} ({' '.join(argv)}): {exc}") from exc
    return Worker(local_rank, job.config.global_rank(local_rank), transport.get_pid(), protocol, replacement)


async def _exit_of(worker: Worker) -> Worker:
    await asyncio.shield(worker.protocol.exited)
    return worker


async def _stop(workers: list[Worker], signum: int, grace: float, signals: _Signals) -> None:
    """Send ``signum`` to every live worker's group, SIGKILL after ``grace`` s or a new signal."""
    alive = [w for w in workers if not w.protocol.exited.done()]
    for worker in alive:
        _killpg(worker.pid, signum)
    if alive:
        exited = asyncio.ensure_future(asyncio.wait([w.protocol.exited for w in alive]))
        again = asyncio.ensure_future(signals.wait_beyond(len(signals.received)))
        await asyncio.wait({exited, again}, timeout=grace, return_when=asyncio.FIRST_COMPLETED)
        again.cancel()
        exited.cancel()
    for worker in workers:  # the leaders still alive, and whatever they left in their groups
        _killpg(worker.pid, signal.SIGKILL)
    if workers:
        await asyncio.wait([w.protocol.exited for w in workers])
        # Output still in the pipes arrives before the pipes close; a process
        # that left its group (setsid) may hold them open: stop reading then.
        await asyncio.wait([w.protocol.closed for w in workers], timeout=_DRAIN_SECONDS)
    for worker in workers:
        if worker.protocol.transport is not None:
            worker.protocol.transport.close()


async def _run_continuing(job: Job, restart_count: int, signals: _Signals,
                          consoles: tuple[Console, Console]) -> Worker | int | None:
    """One attempt under ``--on-failure continue``; returns as :func:`_run_group`."""
    workers: list[Worker] = []
    outcome: Worker | int | None = None
    try:
        for local_rank in range(job.config.nproc_per_node):
            workers.append(await _start(job, local_rank, restart_count, consoles))
        interrupted = asyncio.ensure_future(signals.wait_beyond(len(signals.received)))
        pending: set[asyncio.Future] = {interrupted, *(asyncio.ensure_future(_exit_of(w)) for w in workers)}
        replaced, closed = 0, False  # closed: the waiting room, once no rank is left to admit a replacement
        try:
            while pending != {interrupted}:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if interrupted in done:
                    outcome = signals.received[-1]
                    break
                for worker in sorted((t.result() for t in done), key=lambda w: w.protocol.exit_at):
                    if worker.protocol.exited.result() == 0:
                        continue
                    await asyncio.wait([worker.protocol.closed], timeout=_LAST_WORDS_SECONDS)
                    if never_admitted(worker):
                        print(f"asyncdist-run: {worker.name} was never admitted (the job ended before a grow)",
                              file=sys.stderr, flush=True)
                        continue
                    print(f"asyncdist-run: {worker.describe_exit()}; the other workers continue (--on-failure "
                          f"continue); the last lines of its stderr:{worker.stderr_tail()}", file=sys.stderr, flush=True)
                    if replaced < job.config.replace and not closed:
                        replaced += 1
                        new = await _start(job, worker.local_rank, restart_count, consoles, replaced)
                        workers.append(new)
                        pending.add(asyncio.ensure_future(_exit_of(new)))
                        print(f"asyncdist-run: started replacement {replaced} of {job.config.replace} (pid {new.pid}) "
                              f"for worker {worker.name}; it joins the job when its ranks call grow_group()",
                              file=sys.stderr, flush=True)
                if not closed and job.config.nnodes == 1 and waiting_room.still_waiting(workers):
                    closed = True  # no rank is left to call grow_group(): the replacements must not wait for one
                    await waiting_room.close(job.store, restart_count)
        finally:
            for task in pending:
                task.cancel()
        if outcome is None:
            print(summary(workers), file=sys.stderr, flush=True)
            outcome = continuing_failure(workers)
    finally:
        if isinstance(outcome, int):
            print(f"asyncdist-run: received {signal_name(outcome)}; stopping the workers", file=sys.stderr, flush=True)
        await _stop(workers, outcome if isinstance(outcome, int) else signal.SIGTERM, job.config.shutdown_timeout,
                    signals)
    return outcome


async def _run_group(job: Job, restart_count: int, signals: _Signals,
                     consoles: tuple[Console, Console]) -> Worker | int | None:
    """One attempt. Returns None (success), the first failed worker, or a signal number."""
    if job.config.on_failure == "continue":
        return await _run_continuing(job, restart_count, signals, consoles)
    workers: list[Worker] = []
    outcome: Worker | int | None = None
    gathering: asyncio.Future | None = None
    try:
        for local_rank in range(job.config.nproc_per_node):
            workers.append(await _start(job, local_rank, restart_count, consoles))
        if job.config.node_rank == 0:  # node 0 serves the store: it can name whoever is missing
            gathering = asyncio.ensure_future(report_gathering(job.store, restart_count, job.config.world_size,
                                                               job.config.nproc_per_node))
        # In the order the exits are seen, so the rank that failed first is the
        # one blamed, not a peer that failed a moment later because it was gone.
        watched = [asyncio.ensure_future(_exit_of(w)) for w in workers]
        interrupted = asyncio.ensure_future(signals.wait_beyond(len(signals.received)))
        failed: list[Worker] = []
        settle: float | None = None  # loop time until which relayed failures wait for their cause
        loop = asyncio.get_running_loop()
        pending: set[asyncio.Future] = {*watched, interrupted}
        try:
            while True:
                timeout = None if settle is None else max(settle - loop.time(), 0.0)
                done, pending = await asyncio.wait(pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if not done:  # the settling time is over
                    break
                if interrupted in done:
                    outcome = signals.received[-1]
                    break
                for worker in sorted((t.result() for t in done), key=lambda w: w.protocol.exit_at):
                    if worker.protocol.exited.result() != 0:
                        # Its last words may still be in the pipe (a child it left may hold it open).
                        await asyncio.wait([worker.protocol.closed], timeout=_LAST_WORDS_SECONDS)
                        failed.append(worker)
                        settle = settle or loop.time() + _SETTLE_SECONDS
                if any(not w.protocol.relays for w in failed):
                    break
                if pending == {interrupted}:  # every worker has exited
                    break
        finally:
            for task in (*watched, interrupted):
                task.cancel()
        if outcome is None and failed:
            outcome = blame(failed, workers)
    finally:
        if gathering is not None:
            gathering.cancel()
        if isinstance(outcome, Worker):
            print(f"asyncdist-run: {outcome.describe_exit()}, the first to fail; stopping the other workers; "
                  f"the last lines of its stderr:{outcome.stderr_tail()}", file=sys.stderr, flush=True)
        elif isinstance(outcome, int):
            print(f"asyncdist-run: received {signal_name(outcome)}; stopping the workers",
                  file=sys.stderr, flush=True)
        stop_with = outcome if isinstance(outcome, int) else signal.SIGTERM
        await _stop(workers, stop_with, job.config.shutdown_timeout, signals)
    return outcome


async def _begin_attempt(job: Job, restart_count: int, signals: _Signals) -> int | None:
    """Wait until the stores are ready for this attempt (torch's served afresh,
    :meth:`Job.begin_attempt`); the number of a signal received meanwhile, else None.

    Raises:
        LaunchError: node 0 cannot serve torch's store again, or (another node)
            did not within the join timeout.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + JOIN_TIMEOUT.total_seconds()
    while True:
        ready = await asyncio.to_thread(job.begin_attempt, restart_count, _READY_SLICE)
        if signals.received:  # meanwhile; no worker of this attempt runs yet
            return signals.received[-1]
        if ready:
            return None
        if loop.time() > deadline:
            raise LaunchError(f"node 0 did not start attempt {restart_count} within "
                              f"{JOIN_TIMEOUT.total_seconds():g} s")


async def run_job(job: Job, stdout: BinaryIO | None = None, stderr: BinaryIO | None = None) -> int:
    """Run the worker group, restarting it after failures as configured (main thread only).

    Args:
        job: the node's job (store served or joined).
        stdout, stderr: where workers' lines go (default: the launcher's own).

    Returns:
        The launcher's exit code: 0, :data:`FAILURE_EXIT_CODE`, or 128 + a signal number.

    Raises:
        LaunchError: a worker could not be started, or the stores could not
            be made ready for a restart.
    """
    consoles = (Console(stdout or sys.stdout.buffer), Console(stderr or sys.stderr.buffer))
    loop = asyncio.get_running_loop()
    signals = _Signals()
    signals.install(loop)
    try:
        last = job.config.max_restarts
        for restart_count in range(last + 1):
            if signals.received:
                return 128 + signals.received[-1]
            if (interrupted := await _begin_attempt(job, restart_count, signals)) is not None:
                return 128 + interrupted
            outcome = await _run_group(job, restart_count, signals, consoles)
            if outcome is None:
                return 0
            if isinstance(outcome, int):
                return 128 + outcome
            cause = traces.report(job.trace_folder(restart_count), None if outcome.replacement else outcome.rank)
            if restart_count == last:
                first = outcome.describe_exit() + (f", after {last} restarts" if last else "")
                said = f"{cause} (from the flight-recorder dumps); the first worker to fail: {first}" if cause else first
                print(f"asyncdist-run: the job failed: {said}", file=sys.stderr, flush=True)
                return FAILURE_EXIT_CODE
            print(f"asyncdist-run: restarting the worker group ({restart_count + 1} of {last} restarts)",
                  file=sys.stderr, flush=True)
        raise AssertionError("unreachable: the last attempt returns")
    finally:
        signals.uninstall(loop)

"""``spawn``: run a function on n localhost rank processes and collect the results.

The parent serves the job's TCPStore on an ephemeral port (no fixed ports,
no races for one) and starts the ranks with the environment a launcher
gives: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT`` and ``TORCHELASTIC_USE_AGENT_STORE=True`` (the ranks join
the parent's store instead of serving one), plus the job's secret, which
the store is authenticated with too. So ``dist.init_process_group()`` with
no arguments works inside ``fn``, also when ``spawn`` itself runs under
``asyncdist-run``: the ranks are told the store is asyncdist's
(``ASYNCDIST_AGENT_STORE=asyncdist``), and an ``ASYNCDIST_STORE_ADDR``
inherited from the launcher is dropped, so they join the parent's store.

A rank that raises makes ``spawn`` stop the others and re-raise that error
with the rank and the remote traceback (the first error raised, not a peer's
later error about the lost connection); a job that outlives ``timeout`` is
killed. No process outlives the call: each rank leads a process group, and
the group is killed when the call ends, so whatever a rank started goes too.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import queue
import secrets
import signal
import sys
import time
import traceback
import uuid
from typing import Any, Callable

from .. import settings
from ..errors import DistTimeoutError
from ..rendezvous.tcp_store import TCPStore
from .faults import FaultPlan
from .injector import RankKilled, install, installed, note_plan

__all__ = ["spawn", "RemoteTraceback"]

# The forkserver is started once and forks each rank from a clean process
# that has already imported these: a rank starts in milliseconds, and no
# thread of the parent is forked.
_PRELOAD = ["asyncdist", "numpy"]


class RemoteTraceback(Exception):
    """The formatted traceback of an exception raised in a rank process."""

    def __str__(self) -> str:
        return self.args[0]


def _preload() -> list[str]:
    """What the forkserver imports before it forks a rank: asyncdist and NumPy,
    and torch where this process has imported it. Then the ranks' code most
    likely uses torch too, and each rank would otherwise import it again
    (3 s of CPU here); a process that has not needs none of it."""
    return _PRELOAD + (["torch"] if "torch" in sys.modules else [])


def _context() -> multiprocessing.context.ForkServerContext:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(_preload())
    return ctx


def _outcome(rank: int, fn: Callable[..., Any], args: tuple) -> bytes:
    """Run ``fn`` and pickle ``(rank, ok, value or (error, traceback))`` here, in the rank,
    so that a value or error that cannot be pickled is reported, not lost in the queue's thread."""
    try:
        value = fn(*args)
    except BaseException as exc:
        remote = traceback.format_exc()
        try:
            return pickle.dumps((rank, False, (exc, remote)))
        except Exception:
            stand_in = RuntimeError(f"{type(exc).__qualname__}: {exc} (the exception could not be pickled)")
            return pickle.dumps((rank, False, (stand_in, remote)))
    try:
        return pickle.dumps((rank, True, value))
    except Exception as exc:
        error = TypeError(f"the return value of {getattr(fn, '__qualname__', fn)} cannot be pickled: {exc}")
        return pickle.dumps((rank, False, (error, traceback.format_exc())))


def _rank_main(rank: int, env: dict[str, str], fn: Callable[..., Any], args: tuple, results: Any) -> None:
    os.setpgid(0, 0)  # lead a process group, so that spawn can end whatever this rank starts
    os.environ.pop("ASYNCDIST_STORE_ADDR", None)  # an outer asyncdist-run's store, not the parent's
    os.environ.update(env)
    plan = settings.refresh().faults  # this rank's variables, not those its import read
    if plan:
        install(FaultPlan.parse(plan), processes=True)  # kills and pauses by signals, in this process
    try:
        results.put(_outcome(rank, fn, args))
        # In the queue before this rank's sockets close: a peer's error about the
        # lost connection then always arrives after this rank's own error.
        results.close()
        results.join_thread()
    finally:
        import asyncdist

        if asyncdist.is_initialized():
            asyncdist.destroy_process_group()


def spawn(
    n: int,
    fn: Callable[..., Any],
    *args: Any,
    timeout: float = 120.0,
    env: dict[str, str] | None = None,
    faults: FaultPlan | str | None = None,
) -> list[Any]:
    """Run ``fn(*args)`` on ``n`` rank processes; return their results by rank.

    ``fn`` and ``args`` must be picklable (a module-level function).
    ``faults``: a fault plan (:mod:`asyncdist.testing.faults`) each rank
    installs before ``fn`` runs (``ASYNCDIST_FAULTS``; None: the plan
    installed in this process, the pytest plugin's, if any); a rank it kills has
    :class:`~asyncdist.testing.injector.RankKilled` as its result, and an
    error raised notes the plan.

    Raises:
        Exception: the first error raised by a rank, with ``rank`` noted and
            the remote traceback as its ``__cause__``.
        DistTimeoutError: the ranks did not all finish within ``timeout`` s.
    """
    ctx = _context()
    results = ctx.Queue()
    base_env = {
        "WORLD_SIZE": str(n),
        "LOCAL_WORLD_SIZE": str(n),
        "MASTER_ADDR": "127.0.0.1",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "ASYNCDIST_AGENT_STORE": "asyncdist",  # the parent's store speaks asyncdist's protocol
        "ASYNCDIST_SECRET": secrets.token_hex(16),
        "ASYNCDIST_JOB_ID": uuid.uuid4().hex,
        **(env or {}),
    }
    active = installed()
    plan = FaultPlan.of(faults) if faults is not None or active is None else active.plan
    if plan:
        base_env[settings.name_of("faults")] = str(plan)
    # The store is authenticated with the ranks' secret: only they may use it.
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, secret=base_env["ASYNCDIST_SECRET"])
    base_env["MASTER_PORT"] = str(store.port)
    procs = [
        ctx.Process(
            target=_rank_main,
            args=(rank, {**base_env, "RANK": str(rank), "LOCAL_RANK": str(rank)}, fn, args, results),
            name=f"asyncdist-rank-{rank}",
            daemon=True,
        )
        for rank in range(n)
    ]
    try:
        for proc in procs:
            proc.start()
        return _collect(procs, results, timeout, plan.kills)
    except BaseException as exc:
        if plan:
            note_plan(exc, plan)
        raise
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        for proc in procs:
            if proc.pid is not None:
                proc.join()
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)  # what the rank started, if anything is left
        results.close()
        store.close()


def _collect(procs: list, results: Any, timeout: float, doomed: frozenset[int] = frozenset()) -> list[Any]:
    n = len(procs)
    values: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    while len(values) < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            missing = sorted(set(range(n)) - set(values))
            raise DistTimeoutError(f"ranks {missing} did not finish within {timeout:g} s")
        try:
            rank, ok, value = pickle.loads(results.get(timeout=min(remaining, 0.1)))
        except queue.Empty:
            dead = [r for r, p in enumerate(procs) if r not in values and p.exitcode is not None]
            killed = [r for r in dead if r in doomed and procs[r].exitcode == -signal.SIGKILL]
            for r in killed:  # the plan's kill, not an error
                values[r] = RankKilled(r, "SIGKILL")
            if killed:
                continue
            if dead:
                # Let a last result in flight arrive before blaming the exit.
                try:
                    rank, ok, value = pickle.loads(results.get(timeout=1.0))
                except queue.Empty:
                    r = dead[0]
                    raise RuntimeError(f"rank {r} exited with code {procs[r].exitcode} without a result") from None
            else:
                continue
        if not ok:
            error, remote = value
            if hasattr(error, "add_note"):
                error.add_note(f"(raised on rank {rank} of {n})")
            raise error from RemoteTraceback(remote)
        values[rank] = value
    return [values[r] for r in range(n)]

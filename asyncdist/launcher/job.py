"""The launcher's side of the rendezvous: the job's stores, identity and worker environments.

Like torchrun's agent, the launcher on node 0 serves the job's store at
``MASTER_ADDR:MASTER_PORT`` itself and tells its workers so
(``TORCHELASTIC_USE_AGENT_STORE=True``): every worker is a store client, and
the store outlives a failed attempt, so a restarted group rendezvouses on it
again, under ``/worker/attempt_{TORCHELASTIC_RESTART_COUNT}``. When torch is
installed that store is torch's, for torch scripts, and asyncdist's own
store runs beside it, announced in ``ASYNCDIST_STORE_ADDR``
(:mod:`.stores` has the rules). Launchers on the other nodes connect to
node 0's stores, which makes them wait for node 0, and check in when their
workers are done, so node 0 keeps the stores up until every node has
finished (torchrun's exit barrier).

Identity: on a single node the launcher makes a fresh ``ASYNCDIST_SECRET``
and ``ASYNCDIST_JOB_ID`` (unless the environment has them) and hands them to
its workers through their environment only. On several nodes it cannot make
them for the other nodes: the same secret must come from the environment of
every launcher (the job script exports it); without one, rank 0 makes one and
shares it through the store, and the launcher says so on stderr. asyncdist's
store is authenticated with the job's secret when there is one, so that only
the job's workers can use it. The job id is ``--rdzv-id``, else
``ASYNCDIST_JOB_ID``, else (single node) a fresh one.

This module starts no process; :mod:`.supervisor` does.
"""

from __future__ import annotations

import os
import secrets
import sys
import tempfile
import uuid
from pathlib import Path
from datetime import timedelta
from string import Template
from typing import Mapping

from ..errors import StoreError
from ..settings import JOB_ID_ENV, JOIN_ENV, SECRET_ENV
from ..rendezvous.init_method import AGENT_STORE_ENV, STORE_ADDR_ENV
from ..rendezvous.torch_store import AGENT_STORE_KIND_ENV
from .args import LaunchConfig, streams_of
from .traces import TRACE_DIR_ENV, attempt_folder
from .stores import JOIN_TIMEOUT, LaunchError, open_stores, store_kind

__all__ = ["Job", "LaunchError"]

_DONE_KEY = "asyncdist-run/nodes_done"
_ALL_DONE_KEY = "asyncdist-run/all_done"


class Job:
    """One node's share of a job: the store connections and what each worker is told.

    Args:
        config: the parsed command line.
        environ: the launcher's environment, the base of every worker's.

    Raises:
        LaunchError: node 0 cannot serve the stores, or another node cannot reach them.
    """

    def __init__(self, config: LaunchConfig, environ: Mapping[str, str] = os.environ) -> None:
        self.config = config
        self._environ = dict(environ)
        single = config.nnodes == 1
        self.job_id = config.run_id or environ.get(JOB_ID_ENV) or (uuid.uuid4().hex if single else None)
        self.secret = environ.get(SECRET_ENV) or (secrets.token_hex(32) if single else None)
        if self.secret is None:
            print(f"asyncdist-run: {SECRET_ENV} is not set: rank 0 will make the job's secret and share it "
                  f"through the job's store on node 0 ({config.master_addr}), readable by anyone who "
                  f"can reach it; export the same {SECRET_ENV} on every node to avoid this",
                  file=sys.stderr, flush=True)
        self.stores = open_stores(config, self.secret, store_kind(environ))
        self.store = self.stores.store  # asyncdist's: the exit barrier runs on it
        self.port = self.stores.master_port
        self._log_root: Path | None = None  # made when the first log file is

    def begin_attempt(self, restart_count: int, timeout: float) -> bool:
        """Get the stores ready for attempt ``restart_count`` (blocking; see
        :meth:`.stores.JobStores.begin_attempt`): True when it may start,
        False when this node waited ``timeout`` s for node 0 in vain.

        Raises:
            LaunchError: node 0 cannot serve torch's store again.
        """
        return self.stores.begin_attempt(restart_count, timeout)

    def worker_env(self, local_rank: int, restart_count: int, replacement: int = 0) -> dict[str, str]:
        """The environment of one worker: the launcher's, plus torchrun's variables.

        A replacement (``replacement`` > 0, see ``--replace``) gets no rank:
        ``ASYNCDIST_JOIN=1`` instead, and learns its rank when it is admitted.
        """
        cfg = self.config
        rank = cfg.global_rank(local_rank)
        env = dict(self._environ)
        if cfg.nproc_per_node > 1:
            env.setdefault("OMP_NUM_THREADS", "1")  # as torchrun: N workers must not each take every core
        env.setdefault("PYTHONUNBUFFERED", "1")  # lines reach the console as printed, not at exit
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(local_rank),
            WORLD_SIZE=str(cfg.world_size),
            LOCAL_WORLD_SIZE=str(cfg.nproc_per_node),
            GROUP_RANK=str(cfg.node_rank),
            GROUP_WORLD_SIZE=str(cfg.nnodes),
            ROLE_RANK=str(rank),
            ROLE_NAME=cfg.role,
            ROLE_WORLD_SIZE=str(cfg.world_size),
            MASTER_ADDR=cfg.master_addr,
            MASTER_PORT=str(self.port),
            TORCHELASTIC_RESTART_COUNT=str(restart_count),
            TORCHELASTIC_MAX_RESTARTS=str(cfg.max_restarts),
            TORCHELASTIC_RUN_ID=self.job_id or "none",
            **{AGENT_STORE_ENV: "True", AGENT_STORE_KIND_ENV: self.stores.kind},
        )
        if self.stores.store_addr is not None:
            env[STORE_ADDR_ENV] = self.stores.store_addr
        else:  # asyncdist's store is at MASTER_PORT; never an outer job's
            env.pop(STORE_ADDR_ENV, None)
        env.setdefault(TRACE_DIR_ENV, str(self.trace_folder(restart_count)))
        if self.secret is not None:
            env[SECRET_ENV] = self.secret
        if self.job_id is not None:
            env[JOB_ID_ENV] = self.job_id
        if replacement:
            del env["RANK"], env["ROLE_RANK"]
            env[JOIN_ENV] = "1"
        else:
            env.pop(JOIN_ENV, None)
        return env

    def trace_folder(self, restart_count: int) -> Path:
        """Where the workers of attempt ``restart_count`` write their flight-recorder dumps."""
        return Path(self._environ.get(TRACE_DIR_ENV) or attempt_folder(self.config.log_dir, self.job_id, restart_count))

    def worker_argv(self, local_rank: int) -> list[str]:
        """The command line of one worker."""
        cfg = self.config
        local_rank_arg = [f"--local_rank={local_rank}"] if cfg.local_rank_arg else []
        args = [arg.replace("${local_rank}", str(local_rank)) for arg in cfg.script_args]
        return [*cfg.command, *local_rank_arg, *args]

    def log_files(self, local_rank: int, restart_count: int) -> dict[int, Path]:
        """The log file of each of this worker's streams (1 stdout, 2 stderr) that
        ``--redirects`` or ``--tee`` sends to one; its folder is made here.

        torchrun's layout: ``LOG_DIR/RUN_ID/attempt_N/LOCAL_RANK/{stdout,stderr}.log``.
        """
        cfg = self.config
        mask = streams_of(cfg.redirects, local_rank) | streams_of(cfg.tee, local_rank)
        if not mask:
            return {}
        if self._log_root is None:
            base = Path(cfg.log_dir) if cfg.log_dir else Path(tempfile.mkdtemp(prefix="asyncdist-run_"))
            self._log_root = base / (self.job_id or "none")
            print(f"asyncdist-run: the workers' log files are under {self._log_root}", file=sys.stderr, flush=True)
        folder = self._log_root / f"attempt_{restart_count}" / str(local_rank)
        folder.mkdir(parents=True, exist_ok=True)
        return {fd: folder / f"{name}.log" for fd, name in ((1, "stdout"), (2, "stderr")) if mask & fd}

    def to_console(self, local_rank: int) -> tuple[bool, bool]:
        """Whether this worker's stdout and stderr are shown (not filtered out, not redirected)."""
        cfg = self.config
        shown = cfg.local_ranks_filter is None or local_rank in cfg.local_ranks_filter
        redirected = streams_of(cfg.redirects, local_rank) & ~streams_of(cfg.tee, local_rank)
        return shown and not redirected & 1, shown and not redirected & 2

    def prefix(self, local_rank: int, replacement: int = 0) -> bytes:
        """What each output line of this worker starts with (a replacement's
        rank reads ``+N``: it learns its rank only when admitted)."""
        cfg = self.config
        text = Template(cfg.prefix_template).safe_substitute(
            rank=f"+{replacement}" if replacement else cfg.global_rank(local_rank), local_rank=local_rank,
            role_name=cfg.role,
        )
        return text.encode()

    def finish(self, timeout: timedelta = JOIN_TIMEOUT) -> None:
        """Check this node in as done; on node 0, wait until every node has (blocking).

        Node 0's workers may finish before the others', which may still use the
        store; so node 0 keeps serving it until all nodes checked in or ``timeout``.
        """
        if self.config.nnodes == 1:
            return
        try:
            if self.store.add(_DONE_KEY, 1) == self.config.nnodes:
                self.store.set(_ALL_DONE_KEY, "1")
            if self.config.node_rank == 0:
                self.store.wait([_ALL_DONE_KEY], timeout)
        except StoreError as exc:
            print(f"asyncdist-run: not every node checked in as done: {exc}", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Close the stores; on node 0 that stops serving them (idempotent)."""
        self.stores.close()

"""The launcher's side of the rendezvous: the job's store, identity and worker environments.

Like torchrun's agent, the launcher on node 0 serves the job's TCPStore at
``MASTER_ADDR:MASTER_PORT`` itself and tells its workers so
(``TORCHELASTIC_USE_AGENT_STORE=True``): every worker is a store client, and
the store outlives a failed attempt, so a restarted group rendezvouses on it
again, under ``/worker/attempt_{TORCHELASTIC_RESTART_COUNT}``. Launchers on
the other nodes connect to it, which makes them wait for node 0, and check in
when their workers are done, so node 0 keeps the store up until every node
has finished (torchrun's exit barrier).

Identity: on a single node the launcher makes a fresh ``ASYNCDIST_SECRET``
and ``ASYNCDIST_JOB_ID`` (unless the environment has them) and hands them to
its workers through their environment only. On several nodes it cannot make
them for the other nodes: the same secret must come from the environment of
every launcher (the job script exports it); without one, rank 0 makes one and
shares it through the store, and the launcher says so on stderr. The store it
serves (or joins) is authenticated with the job's secret when there is one, so
that only the job's workers can use it. The job id
is ``--rdzv-id``, else ``ASYNCDIST_JOB_ID``, else (single node) a fresh one.

This module starts no process; :mod:`.supervisor` does.
"""

from __future__ import annotations

import os
import secrets
import sys
import uuid
from datetime import timedelta
from string import Template
from typing import Mapping

from ..errors import StoreError
from ..rendezvous.bootstrap import JOB_ID_ENV, SECRET_ENV
from ..rendezvous.init_method import AGENT_STORE_ENV
from ..rendezvous.tcp_store import TCPStore
from .args import LaunchConfig

__all__ = ["Job", "LaunchError"]

#: How long a launcher waits for node 0's store, and node 0 for the others
#: to finish (torchrun's exit barrier waits 300 s too).
JOIN_TIMEOUT = timedelta(seconds=300)
_DONE_KEY = "asyncdist-run/nodes_done"
_ALL_DONE_KEY = "asyncdist-run/all_done"


class LaunchError(Exception):
    """The launcher itself cannot go on (store port taken, master unreachable, ...)."""


class Job:
    """One node's share of a job: the store connection and what each worker is told.

    Args:
        config: the parsed command line.
        environ: the launcher's environment, the base of every worker's.

    Raises:
        LaunchError: node 0 cannot serve the store, or another node cannot reach it.
    """

    def __init__(self, config: LaunchConfig, environ: Mapping[str, str] = os.environ) -> None:
        self.config = config
        self._environ = dict(environ)
        single = config.nnodes == 1
        self.job_id = config.run_id or environ.get(JOB_ID_ENV) or (uuid.uuid4().hex if single else None)
        self.secret = environ.get(SECRET_ENV) or (secrets.token_hex(32) if single else None)
        if self.secret is None:
            print(f"asyncdist-run: {SECRET_ENV} is not set: rank 0 will make the job's secret and share it "
                  f"through the store at {config.master_addr}:{config.master_port}, readable by anyone who "
                  f"can reach that port; export the same {SECRET_ENV} on every node to avoid this",
                  file=sys.stderr, flush=True)
        self.store = self._open_store()
        self.port = self.store.port

    def _open_store(self) -> TCPStore:
        cfg = self.config
        serve = cfg.node_rank == 0
        # One node: bind the master address (loopback by default). Several: every
        # interface, since MASTER_ADDR may resolve to a loopback alias on node 0 itself.
        host = cfg.master_addr if serve and cfg.nnodes == 1 else ("" if serve else cfg.master_addr)
        try:
            return TCPStore(host, cfg.master_port, is_master=serve, timeout=JOIN_TIMEOUT, wait_for_workers=False,
                            secret=self.secret or "")  # the workers' secret: only they may use the store
        except StoreError as exc:
            what = "serve the job's store on" if serve else "reach node 0's store at"
            raise LaunchError(f"cannot {what} {cfg.master_addr}:{cfg.master_port}: {exc}") from exc

    def worker_env(self, local_rank: int, restart_count: int) -> dict[str, str]:
        """The environment of one worker: the launcher's, plus torchrun's variables."""
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
            **{AGENT_STORE_ENV: "True"},
        )
        if self.secret is not None:
            env[SECRET_ENV] = self.secret
        if self.job_id is not None:
            env[JOB_ID_ENV] = self.job_id
        return env

    def worker_argv(self, local_rank: int) -> list[str]:
        """The command line of one worker."""
        cfg = self.config
        local_rank_arg = [f"--local_rank={local_rank}"] if cfg.local_rank_arg else []
        args = [arg.replace("${local_rank}", str(local_rank)) for arg in cfg.script_args]
        return [*cfg.command, *local_rank_arg, *args]

    def prefix(self, local_rank: int) -> bytes:
        """What each output line of this worker starts with."""
        cfg = self.config
        text = Template(cfg.prefix_template).safe_substitute(
            rank=cfg.global_rank(local_rank), local_rank=local_rank, role_name=cfg.role
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
        self.store.close()

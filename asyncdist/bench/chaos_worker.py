"""The rank side of the chaos benchmark: one training process of one path.

``python -m asyncdist.bench.chaos_worker PATH OUT [--replacement] [model flags]``,
started (and killed) by :mod:`asyncdist.bench.chaos`. It trains
:mod:`~asyncdist.bench.chaos_model`'s MLP and talks to the driver by lines:

* stdout, one json object a line: ``ready`` (initialised, waiting for ``go``),
  ``joining`` (a replacement, about to wait for admission), ``failed`` (the
  first error of a step), ``shrunk`` (the survivors' new group is made),
  ``recovered`` (the first step committed after a failure), ``admitted`` (a
  replacement's first step in the job) and ``done`` (its step count; its
  weights are in ``OUT``). Each carries ``t``, ``time.monotonic()``: one
  clock for every process of a host, the driver's included.
* stdin, from the driver: ``go`` (start training), ``grow K`` (K replacements
  have been started so far) and ``stop`` (finish at the next step boundary).

The paths:

* ``asyncdist``: the blocking facade. A step all-reduces the summed gradient
  with two control cells (every rank has heard of a replacement not yet
  admitted; someone was told to stop); a failure anywhere makes every
  survivor revoke, ``agree(0)``, ``shrink_group()``, agree (MIN) on the
  earliest step that failed, roll back to its copy of the weights before it,
  and take the group's weights by broadcast. A control decision is first
  confirmed with ``agree(1)``, so that no rank stops or grows while another
  redoes the step; a replacement is taken in by ``grow_group(min_joiners=1)``.
* ``torchft-gloo`` / ``torchft-asyncdist``: torchft's ``Manager`` (quorum by
  the driver's lighthouse, healing by checkpoint transfer) over the process
  group that :data:`PROCESS_GROUPS` makes; a step commits where
  ``should_commit()`` says so, and is redone otherwise. A survivor has
  ``recovered`` at its first step committed in a new quorum (or after a
  failed one).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from datetime import timedelta
from typing import Any, Callable

import numpy as np

from .chaos_model import Model, apply, grad

__all__ = ["PROCESS_GROUPS", "main"]


def emit(event: str, **fields: object) -> None:
    """One event line for the driver."""
    print(json.dumps({"event": event, "t": time.monotonic(), "pid": os.getpid(), **fields}), flush=True)


class Orders:
    """What the driver said on stdin, read by a thread: ``go``, the replacements started, ``stop``."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.started = 0
        self.stop = False
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in sys.stdin:
            word, *rest = line.split()
            if word == "go":
                self.go.set()
            elif word == "grow":
                self.started = max(self.started, int(rest[0]))
            elif word == "stop":
                self.stop = True
        self.stop = True  # the driver is gone
        self.go.set()


def _save(out: str, params: np.ndarray, steps: int) -> None:
    np.save(out, params)
    emit("done", steps=steps, out=out)


# -- path (a): asyncdist's shrink and grow, through the facade ----------------------------


def train_asyncdist(model: Model, out: str, replacement: bool, orders: Orders) -> None:
    """Train with asyncdist's facade until told to stop; survive failures by shrink, grow to admit."""
    import asyncdist as dist

    if replacement:
        emit("joining")
    dist.init_process_group("gloo")  # a replacement (ASYNCDIST_JOIN=1) waits here for grow_group()
    if not replacement:
        emit("ready", gid=dist.get_rank())
        orders.go.wait()
    run = _Elastic(model, None if replacement else model.init())
    run.train(orders)
    assert run.params is not None
    _save(out, run.params, run.step)
    dist.destroy_process_group()


#: Larger than any rank or step: what a rank with no weights yet adds to a MIN.
_NONE = float(1 << 52)


class _Elastic:
    """One rank's training state under asyncdist: the weights, the step, and a copy before each of the last two."""

    def __init__(self, model: Model, params: np.ndarray | None) -> None:
        self.model, self.params = model, params
        self.step = self.admitted = 0
        self.before: dict[int, np.ndarray] = {}

    def train(self, orders: Orders) -> None:
        """Steps until a confirmed stop; a failure anywhere is recovered from, and the step redone."""
        import asyncdist as dist
        from asyncdist.errors import AsyncDistError

        recovering = False
        while True:
            try:
                if self.params is None:  # a replacement just admitted (or a share that failed)
                    self._share()
                    emit("admitted", gid=dist.get_process_group_ranks(dist.group.WORLD)[dist.get_rank()])
                if self._step(orders, recovering):
                    return
                recovering = False
            except AsyncDistError as exc:
                emit("failed", error=type(exc).__name__)
                self._recover()
                recovering = True

    def _step(self, orders: Orders, recovering: bool) -> bool:
        """One step, and the control decision it carries; True to stop."""
        import asyncdist as dist

        assert self.params is not None
        kept = {self.step - 1: self.before[self.step - 1]} if self.step - 1 in self.before else {}
        self.before = {**kept, self.step: self.params.copy()}
        rank, size = dist.get_rank(), dist.get_world_size()
        cells = np.concatenate([grad(self.model, self.params, self.step, rank, size),
                                [float(orders.started > self.admitted), float(orders.stop)]])
        dist.all_reduce(cells)
        apply(self.model, self.params, cells[:-2])
        self.step += 1
        if recovering:
            emit("recovered", size=size, step=self.step)
        stop, grow = cells[-1] > 0, cells[-2] == size
        if not (stop or grow) or not dist.agree(1):
            return False  # agree(1) == 0: another rank failed the step, and the next call here fails too
        if stop:
            return True
        start = time.monotonic()
        grown = dist.grow_group(timeout=60, min_joiners=1)
        self.admitted += grown.size - size
        self._share()
        if rank == 0:
            emit("grown", size=grown.size, pause=time.monotonic() - start)
        return False

    def _share(self) -> None:
        """The step, the count of admitted replacements and the weights of the lowest rank that has them."""
        import asyncdist as dist

        src = np.array([float(dist.get_rank()) if self.params is not None else _NONE])
        dist.all_reduce(src, op=dist.ReduceOp.MIN)
        meta = np.array([float(self.step), float(self.admitted)])
        params = self.params if self.params is not None else np.empty(self.model.size)
        dist.broadcast(meta, group_src=int(src[0]))
        dist.broadcast(params, group_src=int(src[0]))
        self.step, self.admitted, self.params = int(meta[0]), int(meta[1]), params

    def _recover(self) -> None:
        """Shrink to the survivors, roll back to the earliest step not completed everywhere, share the weights.

        ``agree(0)`` before the shrink: a rank that completed the step and
        confirms a control decision runs ``agree(1)`` at that point, so the
        agreements of every rank stay in step (and that one learns not to act).
        Retried while ranks keep failing.
        """
        import asyncdist as dist
        from asyncdist.errors import AsyncDistError

        while True:
            try:
                dist.revoke()
                dist.agree(0)
                dist.shrink_group()
                emit("shrunk", size=dist.get_world_size())
                redo = np.array([float(self.step) if self.params is not None else _NONE])
                dist.all_reduce(redo, op=dist.ReduceOp.MIN)  # ranks are at most one step apart
                if self.params is not None and int(redo[0]) < self.step:  # undo the step others failed
                    self.step = int(redo[0])
                    self.params = self.before[self.step].copy()
                self._share()
                self.before = {}
                return
            except AsyncDistError as exc:
                emit("failed", error=type(exc).__name__)


# -- paths (b) and (c): torchft's Manager over a process group ------------------------------


def _gloo_group(timeout: timedelta) -> Any:
    """torchft's own reconfigurable gloo group (path c)."""
    from torchft.process_group import ProcessGroupGloo

    return ProcessGroupGloo(timeout=timeout)


def _asyncdist_group(timeout: timedelta) -> Any:
    """asyncdist as torchft's process group (path b)."""
    from asyncdist.torchft import ProcessGroupAsyncdist

    return ProcessGroupAsyncdist(timeout=timeout)


#: The process group each torchft path gives its ``Manager``, made from the timeout of its operations.
PROCESS_GROUPS: dict[str, Callable[[timedelta], Any]] = {
    "torchft-gloo": _gloo_group,
    "torchft-asyncdist": _asyncdist_group,
}


def train_torchft(model: Model, out: str, replacement: bool, orders: Orders, make_group: Callable[[timedelta], Any],
                  lighthouse: str, replica_id: str, timeout: timedelta) -> None:
    """Train one replica group of one process under torchft's ``Manager`` until told to stop."""
    import torch
    from torch.distributed import ReduceOp, TCPStore
    from torchft import Manager

    torch.set_num_threads(1)
    store = TCPStore("localhost", 0, is_master=True, wait_for_workers=False)  # this replica group's own
    state = {"params": model.init()}

    def load(saved: dict[str, Any]) -> None:
        state["params"] = saved["params"].numpy().copy()

    manager = Manager(
        pg=make_group(timeout), min_replica_size=1, load_state_dict=load,
        state_dict=lambda: {"params": torch.from_numpy(state["params"].copy())},
        replica_id=replica_id, store_addr="localhost", store_port=store.port, rank=0, world_size=1,
        lighthouse_addr=lighthouse, hostname="localhost", timeout=timeout, quorum_timeout=timeout * 6,
        connect_timeout=timeout, use_async_quorum=False,
    )
    try:
        if replacement:
            emit("joining")
        else:
            emit("ready", gid=replica_id)
            orders.go.wait()
        joined, failed, last, last_quorum = not replacement, False, 0, None
        while True:
            manager.start_quorum()
            rank, size = manager.participating_rank(), manager.num_participants()
            quorum = manager._quorum_id  # torchft 0.2.0 has no public name for the quorum in use
            if failed:
                emit("shrunk", size=size)
            cells = np.concatenate([grad(model, state["params"], manager.current_step(),
                                         -1 if rank is None else rank, size), [float(orders.stop)]])
            manager.allreduce(torch.from_numpy(cells), reduce_op=ReduceOp.SUM).wait()
            if not manager.should_commit():
                if not failed:
                    emit("failed", error=repr(manager.errored())[:200])
                failed = True
                continue
            apply(model, state["params"], cells[:-1])
            if not joined:
                emit("admitted", gid=replica_id)
            elif failed or size < last or quorum != last_quorum:
                # a new quorum that commits leaves a killed replica out, or has its replacement in
                # its place: a survivor whose own step never failed has recovered too
                emit("recovered", size=size, step=manager.current_step())
            joined, failed, last, last_quorum = True, False, size, quorum
            if cells[-1] > 0:
                break
        _save(out, state["params"], manager.current_step())
    finally:
        manager.shutdown(wait=False)
        del store


def main(argv: list[str] | None = None) -> None:
    """Run one worker (see the module's docstring)."""
    p = argparse.ArgumentParser(prog="python -m asyncdist.bench.chaos_worker")
    p.add_argument("path", choices=["asyncdist", *PROCESS_GROUPS])
    p.add_argument("out", help="where to save the final weights (.npy)")
    p.add_argument("--replacement", action="store_true", help="join a running job")
    p.add_argument("--model", default="{}", help="the Model's fields, as json")
    p.add_argument("--lighthouse", help="torchft: the lighthouse's address")
    p.add_argument("--replica-id", default="", help="torchft: this replica group's id")
    p.add_argument("--timeout", type=float, default=10.0, help="torchft: the Manager's timeout (s)")
    args = p.parse_args(argv)
    model, orders = Model(**json.loads(args.model)), Orders()
    if args.path == "asyncdist":
        train_asyncdist(model, args.out, args.replacement, orders)
    else:
        train_torchft(model, args.out, args.replacement, orders, PROCESS_GROUPS[args.path], args.lighthouse,
                      args.replica_id, timedelta(seconds=args.timeout))


if __name__ == "__main__":
    main()

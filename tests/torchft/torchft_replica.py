"""One replica group (of one process) of the torchft test: ``python torchft_replica.py ARGS``.

It trains a small model with torchft's Manager, fault-tolerant DDP and
optimizer wrapper, over the process group each run names, on a batch that
depends only on the step and the replica's index, so that the final weights
are reproducible. With ``kill_at`` it SIGKILLs itself at that step, after
its forward pass: the other replicas are then in (or about to enter) DDP's
all-reduce, waiting on it. Each run writes its final weights, and what the
replica saw, to its ``out``.

Arguments (a JSON object): ``index`` (0, 1, 2), ``replicas``, ``steps``,
``standby`` (true: wait for a line on stdin before the first run, so that a
replacement has imported torch before it is needed), and ``runs``, each
with ``pg`` ("asyncdist" or "gloo"), ``lighthouse`` (address), ``kill_at``
(a step, or null) and ``out`` (a path). Running several jobs in one
process saves a start-up of torch (seconds on a loaded 2-core machine).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo

from asyncdist.torchft import ProcessGroupAsyncdist

#: Every wait of the Manager (a collective, should_commit, the checkpoint's transfer).
TIMEOUT = timedelta(seconds=20)


def model() -> torch.nn.Module:
    """The model, the same on every replica (and in the test's reference)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).double()


def batch(step: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Replica ``index``'s inputs and targets at ``step`` (the test's reference uses it too)."""
    generator = torch.Generator().manual_seed(1000 * step + index)
    return (torch.randn(4, 8, generator=generator, dtype=torch.float64),
            torch.randn(4, 4, generator=generator, dtype=torch.float64))


def optimizer(params: object) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)  # type: ignore[arg-type]


def main(args: dict) -> None:
    if args["standby"]:
        sys.stdin.readline()
    for job in args["runs"]:
        train({**args, **job})


def train(args: dict) -> None:
    if args["pg"] == "asyncdist":
        pg = ProcessGroupAsyncdist(TIMEOUT)
    else:
        pg = ProcessGroupGloo(TIMEOUT)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # the replica group's own
    net = model()
    inner = optimizer(net.parameters())
    manager = Manager(
        pg=pg,
        load_state_dict=lambda state: (net.load_state_dict(state["model"]), inner.load_state_dict(state["optim"])),
        state_dict=lambda: {"model": net.state_dict(), "optim": inner.state_dict()},
        min_replica_size=args["replicas"],
        use_async_quorum=False,  # heal before the forward pass: every replica takes part in every step
        init_sync=False,  # the weights start equal (seeded)
        timeout=TIMEOUT,
        quorum_timeout=TIMEOUT,
        connect_timeout=TIMEOUT,
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=store.port,
        lighthouse_addr=args["lighthouse"],
        replica_id=f"replica_{args['index']}",
        hostname="127.0.0.1",
    )
    ddp = DistributedDataParallel(manager, net)
    optim = Optimizer(manager, inner)
    seen: dict = {"first_step": None, "failed_steps": [], "errors": []}
    try:
        while manager.current_step() < args["steps"]:
            optim.zero_grad()  # the quorum; a replica that restarted heals here
            step = manager.current_step()
            if seen["first_step"] is None:
                seen["first_step"] = step
            inputs, targets = batch(step, args["index"])
            loss = torch.nn.functional.mse_loss(ddp(inputs), targets)
            if step == args["kill_at"]:
                os.kill(os.getpid(), signal.SIGKILL)
            loss.backward()  # DDP's all-reduce, through the Manager and the process group
            error = pg.errored()
            optim.step()  # commits only if every replica's all-reduce succeeded
            if manager.current_step() == step:
                seen["failed_steps"].append(step)
                if error is not None:
                    seen["errors"].append([type(error).__name__, getattr(error, "rank", None), str(error)])
        torch.save({"weights": {k: v.clone() for k, v in net.state_dict().items()}, **seen}, args["out"])
    finally:
        manager.shutdown(wait=False)
        pg.shutdown()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))

"""torchft's Manager over ProcessGroupAsyncdist: a replica killed mid-step, restarted, healed.

Three replica groups of one process each train with torchft's Manager, a
real LighthouseServer (from the torchft wheel) and torchft's fault-tolerant
DDP (``torchft_replica.py``). In the asyncdist run, replica 2 SIGKILLs
itself after its forward pass at step 2; the test restarts it, and it heals
from the others (the Manager's checkpoint transfer) before it trains on.
Every replica must end with the same weights as the same job run over
torchft's ProcessGroupGloo, and as a sequential reference computed here.
With ``min_replicas`` = 3 no step commits without all three replicas, so
the failed step is redone by all of them and the result does not depend
on timing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchft")

from torchft.coordination import LighthouseServer  # noqa: E402  (torchft is needed first)
from torchft_replica import batch, model, optimizer  # noqa: E402  (same directory)

pytestmark = pytest.mark.timeout(120)  # ~15 s on an idle 2-core machine: five starts of torch

REPLICAS = 3
STEPS = 4
KILLED, KILL_AT = 2, 2
_HERE = Path(__file__).parent
_ROOT = _HERE.parents[1]


def reference() -> dict[str, Any]:
    """The weights after STEPS steps of SGD on the mean gradient of the replicas' batches."""
    net = model()
    optim = optimizer(net.parameters())
    for step in range(STEPS):
        grads = []
        for index in range(REPLICAS):
            net.zero_grad()
            inputs, targets = batch(step, index)
            torch.nn.functional.mse_loss(net(inputs), targets).backward()
            grads.append([p.grad.clone() for p in net.parameters()])
        for p, *per_replica in zip(net.parameters(), *grads):
            p.grad = sum(per_replica) / REPLICAS
        optim.step()
    return net.state_dict()


class Job:
    """The lighthouses and replica processes of the test; everything ends in :meth:`close`.

    Each replica process runs the gloo job, then the asyncdist job; a
    standby process, started with them so that it has imported torch when
    it is needed, replaces the killed replica in the asyncdist job.
    """

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.lighthouses = {pg: LighthouseServer(bind="[::]:0", min_replicas=REPLICAS, join_timeout_ms=100,
                                                 quorum_tick_ms=10, heartbeat_timeout_ms=1000)
                            for pg in ("gloo", "asyncdist")}
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Path] = []

    def out(self, pg: str, index: int, incarnation: int) -> Path:
        return self.tmp / f"{pg}-{index}-{incarnation}.pt"

    def start(self, index: int, pgs: tuple[str, ...], kill_at: int | None = None,
              standby: bool = False) -> subprocess.Popen:
        n = len(self.procs)
        runs = [{"pg": pg, "lighthouse": self.lighthouses[pg].address(), "out": str(self.out(pg, index, n)),
                 "kill_at": kill_at if pg == "asyncdist" else None} for pg in pgs]
        args = {"index": index, "replicas": REPLICAS, "steps": STEPS, "standby": standby, "runs": runs}
        log = self.tmp / f"replica-{index}-{n}.log"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(_ROOT), os.environ.get("PYTHONPATH", "")])}
        with open(log, "w") as out:
            proc = subprocess.Popen([sys.executable, str(_HERE / "torchft_replica.py"), json.dumps(args)],
                                    stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, env=env, text=True)
        self.procs.append(proc)
        self.logs.append(log)
        return proc

    def finish(self) -> None:
        for proc, log in zip(self.procs, self.logs):
            code = proc.wait(timeout=60)
            assert code in (0, -signal.SIGKILL), f"{log.name} exited with {code}:\n{log.read_text()[-4000:]}"

    def result(self, pg: str, index: int) -> dict[str, Any]:
        (out,) = self.tmp.glob(f"{pg}-{index}-*.pt")  # the last incarnation's
        return torch.load(out)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stdin is not None:
                proc.stdin.close()
        for lighthouse in self.lighthouses.values():
            lighthouse.shutdown()


def run(tmp: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The gloo job without a fault, then the asyncdist job with replica KILLED killed and replaced."""
    job = Job(tmp)
    try:
        procs = [job.start(index, ("gloo", "asyncdist"), KILL_AT if index == KILLED else None)
                 for index in range(REPLICAS)]
        standby = job.start(KILLED, ("asyncdist",), standby=True)
        assert procs[KILLED].wait(timeout=60) == -signal.SIGKILL
        assert standby.stdin is not None
        standby.stdin.write("go\n")  # restarts replica KILLED, at step 0, with the same replica id: it heals
        standby.stdin.close()
        job.finish()
        return ([job.result("gloo", index) for index in range(REPLICAS)],
                [job.result("asyncdist", index) for index in range(REPLICAS)])
    finally:
        job.close()


def assert_same(weights: dict[str, Any], expected: dict[str, Any], what: str) -> None:
    assert weights.keys() == expected.keys()
    for name, value in weights.items():
        torch.testing.assert_close(value, expected[name], rtol=1e-5, atol=0, msg=lambda m: f"{what}, {name}: {m}")


def test_a_replica_killed_mid_step_heals_and_ends_with_the_weights_of_a_gloo_run(tmp_path: Path) -> None:
    expected = reference()
    gloo, ours = run(tmp_path)
    for index in range(REPLICAS):
        assert_same(gloo[index]["weights"], expected, f"gloo replica {index} against the reference")
        assert_same(ours[index]["weights"], gloo[index]["weights"], f"asyncdist replica {index} against gloo's")
    # The restarted replica healed to the step that failed, and the others redid it.
    assert ours[KILLED]["first_step"] == KILL_AT
    for index in set(range(REPLICAS)) - {KILLED}:
        assert ours[index]["failed_steps"] == [KILL_AT], ours[index]
        ((kind, rank, message),) = ours[index]["errors"]  # asyncdist's error, naming the killed replica's rank
        assert kind == "PeerLostError" and rank == KILLED, message
    assert all(not r["failed_steps"] for r in gloo)

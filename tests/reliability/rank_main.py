"""The rank side of the reliability tests: ``python rank_main.py SCENARIO API [ARGS]``.

Each rank reads the launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, ASYNCDIST_SECRET, ...), joins the job through the blocking
facade (API ``facade``) or the await API (``await``), and prints one JSON
object per line: events with ``time.monotonic()`` stamps (the same clock in
every process of a host), so the test can measure how long after a kill a
rank raised. The test drives a scenario through the store: a rank that must
wait for the test blocks on a key the test sets.

Scenarios:

* ``all_reduce VICTIM LATE COUNT``: every rank but LATE enters an all_reduce
  of COUNT float64 (VICTIM enters it and then stalls, waiting to be killed);
  LATE enters only when the test sets ``go``.
* ``recv VICTIM``: rank 0 receives from VICTIM, the others from any rank;
  afterwards the survivors all_reduce on subgroups without VICTIM.
* ``send VICTIM COUNT``: rank 0 sends COUNT float64 to VICTIM (which the test
  has stopped, so the send stalls) after the test sets ``go``.
* ``rounds ROUNDS COUNT``: check an all_reduce of 16 and of COUNT float64,
  then run ROUNDS small all_reduces, reporting each, until one fails.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from datetime import timedelta

import numpy as np

import asyncdist as dist
from asyncdist.rendezvous.tcp_store import TCPStore


def emit(event: str, **fields) -> None:
    print(json.dumps({"event": event, "rank": int(os.environ["RANK"]), "t": time.monotonic(), **fields}), flush=True)


def failure(exc: BaseException) -> dict:
    return {"type": type(exc).__name__, "lost": getattr(exc, "rank", None), "message": str(exc),
            "timeout_error": isinstance(exc, TimeoutError)}


def wait_for_test(key: str) -> None:
    """Block until the test sets ``key`` in the job's store."""
    store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), timeout=timedelta(seconds=60))
    store.wait([f"test/{key}"])
    store.close()


class Facade:
    """The scenario's operations through the blocking facade."""

    def __init__(self) -> None:
        dist.init_process_group(timeout=timedelta(seconds=60))
        self.rank, self.size = dist.get_rank(), dist.get_world_size()

    def all_reduce(self, x) -> None:
        dist.all_reduce(x)

    def start_all_reduce(self, x) -> None:
        self.pending = dist.all_reduce(x, async_op=True)

    def send(self, x, dst: int) -> None:
        dist.isend(x, dst).wait()

    def recv(self, x, src: int | None) -> int:
        return dist.recv(x, src)

    def new_group(self, ranks: list[int]):
        return dist.new_group(ranks)

    def group_all_reduce(self, group, x) -> None:
        dist.all_reduce(x, group=group)

    def close(self) -> None:
        dist.destroy_process_group()


class Await:
    """The same operations through the await API, on a loop in a thread of
    its own (so that the scenario code reads the same as the facade's)."""

    def __init__(self) -> None:
        import threading

        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.world = self._do(dist.init_world(timeout=60))
        self.rank, self.size = self.world.rank, self.world.size

    def _do(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def all_reduce(self, x) -> None:
        self._do(self.world.all_reduce(x))

    def start_all_reduce(self, x) -> None:
        self.pending = asyncio.run_coroutine_threadsafe(self.world.all_reduce(x), self.loop)

    def send(self, x, dst: int) -> None:
        self._do(self.world.send(x, dst))

    def recv(self, x, src: int | None) -> int:
        return self._do(self.world.recv(x, src))

    def new_group(self, ranks: list[int]):
        async def make():
            return self.world.new_group(ranks)

        return self._do(make())

    def group_all_reduce(self, group, x) -> None:
        self._do(group.all_reduce(x))

    def close(self) -> None:
        self._do(self.world.close())


def stall_until_killed() -> None:
    emit("stalled")
    time.sleep(3600)


def scenario_all_reduce(api, victim: int, late: int, count: int) -> None:
    x = np.full(count, api.rank + 1.0)
    emit("ready")
    if api.rank == victim:
        api.start_all_reduce(x)
        emit("entered")
        stall_until_killed()
    if api.rank == late:
        wait_for_test("go")
    emit("entered")
    try:
        api.all_reduce(x)
    except Exception as exc:
        emit("error", **failure(exc))
    else:
        emit("done", value=float(x[0]))


def scenario_recv(api, victim: int) -> None:
    survivors = [r for r in range(api.size) if r != victim]
    early = api.new_group(survivors)  # made before the death, by every rank
    emit("ready")
    if api.rank == victim:
        stall_until_killed()
    x = np.zeros(4)
    try:
        api.recv(x, victim if api.rank == 0 else None)
    except Exception as exc:
        emit("error", **failure(exc))
    else:
        emit("done")
        return
    # Ranks not involved carry on: on the group made before, on one made
    # after (by the survivors only: new_group sends nothing), and point to point.
    late = api.new_group(survivors)
    values = []
    for group in (early, late):
        y = np.full(3, float(api.rank))
        api.group_all_reduce(group, y)
        values.append(float(y[0]))
    if api.rank == survivors[0]:
        api.send(np.full(2, 7.0), survivors[1])
    elif api.rank == survivors[1]:
        z = np.zeros(2)
        api.recv(z, survivors[0])
        values.append(float(z[0]))
    emit("carried_on", values=values)


def scenario_send(api, victim: int, count: int) -> None:
    emit("ready")
    if api.rank == victim:
        stall_until_killed()
    if api.rank != 0:
        emit("done")
        return
    wait_for_test("go")
    emit("entered")
    try:
        api.send(np.ones(count), victim)
    except Exception as exc:
        emit("error", **failure(exc))
    else:
        emit("done")


def scenario_rounds(api, rounds: int, count: int) -> None:
    emit("ready")
    for c in (16, count):
        x = np.arange(c, dtype=np.float64) + api.rank
        api.all_reduce(x)
        want = np.arange(c, dtype=np.float64) * api.size + sum(range(api.size))
        emit("checked", count=c, ok=bool(np.array_equal(x, want)))
    for i in range(rounds):
        x = np.ones(1000)
        try:
            api.all_reduce(x)
        except Exception as exc:
            emit("error", round=i, **failure(exc))
            return
        emit("round", i=i, ok=bool((x == api.size).all()))
        time.sleep(0.05)
    emit("done")


def main() -> None:
    scenario, api_name, *args = sys.argv[1:]
    api = Facade() if api_name == "facade" else Await()
    scenarios = {"all_reduce": scenario_all_reduce, "recv": scenario_recv, "send": scenario_send,
                 "rounds": scenario_rounds}
    scenarios[scenario](
        api, *(int(a) for a in args)
    )
    emit("exit")
    os._exit(0)  # don't wait for dead peers in a clean shutdown


if __name__ == "__main__":
    main()

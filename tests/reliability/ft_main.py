"""The rank side of the fault-tolerance process tests: ``python ft_main.py ROUNDS AFTER``.

Each rank joins with the await API (the launcher's environment, as in
``rank_main.py``), waits for the test's ``go``, then runs the loop of
docs/fault-tolerance.md: all_reduce rounds; on an error, revoke; agree;
shrink and go on. It runs ROUNDS rounds in the first group (0: until an
error) and AFTER in each group a shrink makes, then agrees that all went
well. Events (JSON lines, ``time.monotonic()`` stamps):

* ``ready``; ``shrunk`` (the new group's ranks, the error that led there);
* ``working``: the first all_reduce in a new group completed, right;
* ``done``: the last agree's value, the group's ranks and failed ranks;
* ``excluded``: the others dropped this rank (RankExcludedError).
"""

from __future__ import annotations

import asyncio
import os
import sys

import numpy as np

import asyncdist
from asyncdist.errors import AsyncDistError, RankExcludedError

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rank_main import emit, wait_for_test  # noqa: E402  (same directory)


async def survive(rounds: int, after: int) -> None:
    g = await asyncdist.init_world(timeout=60)
    emit("ready", pid=os.getpid())
    await asyncio.get_running_loop().run_in_executor(None, wait_for_test, "go")
    target, done, fresh, error = rounds, 0, False, ""
    while True:
        try:
            x = np.ones(8)
            await g.all_reduce(x)
            assert x.tolist() == [float(g.size)] * 8, x
            ok, done = 1, done + 1
            if fresh:
                emit("working", size=g.size)
                fresh = False
        except RankExcludedError as exc:
            emit("excluded", message=str(exc))
            return
        except AsyncDistError as exc:
            ok, error = 0, type(exc).__name__
            await g.revoke()
        if ok and done != target:
            continue
        try:
            agreed = await g.agree(ok)
            if agreed:
                emit("done", agreed=agreed, ranks=list(g.ranks), failed=g.failed_ranks())
                await g.close()
                return
            g = await g.shrink()
        except RankExcludedError as exc:
            emit("excluded", message=str(exc))
            return
        emit("shrunk", ranks=list(g.ranks), error=error)
        target, done, fresh = after, 0, True


if __name__ == "__main__":
    asyncio.run(survive(int(sys.argv[1]), int(sys.argv[2])))

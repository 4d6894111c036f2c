"""A rank killed with SIGKILL under ``asyncdist-run``: each survivor dumps its
record into the attempt's log folder, naming the dead rank and what it waited for."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from asyncdist.trace.analyze import analyze
from asyncdist.trace.load import load

# Two all_reduces; rank 2 dies before the second, in which ranks 0 and 1 wait
# for it (it dies once both told it that the first completed for them). A
# survivor that failed waits for the other to fail too (a marker file each)
# before it leaves, so that neither sees the other leave instead. They ignore
# the launcher's SIGTERM, and end by their own PeerLostError.
SCRIPT = """
import os, signal, sys, time
from pathlib import Path
import numpy as np
import asyncdist as dist
from asyncdist.errors import PeerLostError

signal.signal(signal.SIGTERM, signal.SIG_IGN)
dist.init_process_group()
rank = dist.get_rank()
x = np.ones(4)
dist.all_reduce(x)
if rank == 2:
    for peer in (0, 1):
        dist.recv(np.zeros(1), src=peer)
    os.kill(os.getpid(), signal.SIGKILL)
dist.send(np.ones(1), dst=2)
try:
    dist.all_reduce(x)
except PeerLostError:
    Path(f"failed{rank}").touch()
    deadline = time.monotonic() + 30
    while not all(Path(f"failed{r}").exists() for r in (0, 1)) and time.monotonic() < deadline:
        time.sleep(0.01)
    raise
"""


def test_the_survivors_dumps_name_the_dead_rank_and_what_each_waited_for(tmp_path: Path) -> None:
    script = tmp_path / "dies.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {k: v for k, v in os.environ.items() if k != "ASYNCDIST_TRACE_DIR"}
    result = subprocess.run(
        [sys.executable, "-m", "asyncdist.run", "--standalone", "--nproc-per-node", "3", "--rdzv-id", "dies",
         "--log-dir", str(tmp_path / "logs"), "--shutdown-timeout", "60", str(script)],
        cwd=tmp_path, capture_output=True, text=True, timeout=90, env=env,
    )
    assert result.returncode == 1, result.stderr
    folder = tmp_path / "logs" / "dies" / "attempt_0" / "trace"
    assert f"read them with: asyncdist-trace analyze {folder}" in result.stderr

    trace = load(folder)
    assert sorted(trace.dumps) == [0, 1] and trace.missing == [2]
    for dump in trace.dumps.values():
        assert "lost" in dump.data["reason"] and "2" in dump.data["lost"], dump.data["reason"]
    findings = analyze(trace)
    died, = (f for f in findings if f.kind == "died")
    assert died.ranks == [2] and died.text.startswith("rank 2 died: ")
    waiting = {f.ranks[0]: f for f in findings if f.kind == "waiting"}
    assert sorted(waiting) == [0, 1]
    for rank, finding in waiting.items():
        assert (finding.group, finding.call) == ("world", 2)
        assert finding.details["waiting_for"] and set(finding.details["waiting_for"]) <= {0, 1, 2} - {rank}
        assert finding.details["error"].startswith("PeerLostError")
        assert finding.text.startswith(f"rank {rank} was waiting in all_reduce #2 on group world")

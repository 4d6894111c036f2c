"""``asyncdist-run --on-failure continue`` and ``--replace``, run as real processes.

The last rank kills itself with SIGKILL once every rank is past init; the survivors
see it lost (PeerLostError), keep a group of themselves and, with
``--replace``, grow it with the replacement the launcher started, which
rejoins with ``ASYNCDIST_JOIN=1`` (or, without a grow, is told that it never
will be admitted once the ranks have exited). Every process prints the sum of an
all-reduce over the group it ends in, checked here against the sum of its
members' values; the launcher's summary names who finished and who died.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from asyncdist.launcher.args import build_parser, config_from_args

RUN = [sys.executable, "-m", "asyncdist.run"]
JOB_TIMEOUT = 60  # seconds a launcher run may take before the test fails
# asyncdist's store alone: the launcher need not import torch to serve torch's (2 s of CPU a run).
ENV = {**os.environ, "ASYNCDIST_AGENT_STORE": "asyncdist"}

# The await API, so that the survivors can keep a group of themselves without
# a shrink: new_group over the survivors (every survivor makes it, in the same order).
SURVIVING_SCRIPT = """
import asyncio, os, signal, sys
import numpy as np
import asyncdist
from asyncdist.errors import PeerLostError

async def main():
    joining = os.environ.get("ASYNCDIST_JOIN") == "1"
    world = await asyncdist.init_world(join=joining)
    group = world
    if not joining:
        last = world.size - 1
        if world.rank == last:  # dies once every rank is past init: none can still need its messages
            for peer in range(last):
                await world.recv(np.zeros(1), src=peer)
            os.kill(os.getpid(), signal.SIGKILL)
        await world.send(np.zeros(1), dst=last)
        try:
            await world.barrier()
            sys.exit("the barrier completed without the killed rank")
        except PeerLostError as exc:
            print(f"lost: {exc.rank}", flush=True)
        group = world.new_group(range(world.size - 1))
        if "--grow" in sys.argv:
            group = await group.grow(min_joiners=1)
    x = np.array([group.ranks[group.rank] + 1.0])
    await group.all_reduce(x)
    print(f"rank {group.rank} of {group.size}, ranks {list(group.ranks)}: sum {x[0]:g}", flush=True)
    if group is not world:
        await group.close()
    await world.close()

asyncio.run(main())
"""


def _run(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(SURVIVING_SCRIPT))
    return subprocess.run([*RUN, "--standalone", "--nproc-per-node", "3", *flags], cwd=tmp_path,
                          capture_output=True, text=True, timeout=JOB_TIMEOUT, env=ENV)


def _lines(output: str, who: str) -> list[str]:
    return [m[1] for m in re.finditer(rf"^\[rank {re.escape(who)}\]: (.*)$", output, re.M)]


def test_continue_leaves_the_survivors_running_and_names_who_died(tmp_path: Path) -> None:
    result = _run(tmp_path, "--on-failure", "continue", "job.py")
    assert result.returncode == 0, result.stderr
    for rank in (0, 1):
        assert _lines(result.stdout, str(rank)) == ["lost: 2", f"rank {rank} of 2, ranks [0, 1]: sum {1 + 2}"]
    assert "asyncdist-run: worker rank 2 exited with code -9" in result.stderr
    assert "the other workers continue (--on-failure continue)" in result.stderr
    assert "asyncdist-run: finished: rank 0, rank 1; died: rank 2 (SIGKILL)" in result.stderr


def test_replace_starts_a_worker_that_rejoins_with_the_next_rank(tmp_path: Path) -> None:
    result = _run(tmp_path, "--on-failure", "continue", "--replace", "1", "job.py", "--grow")
    assert result.returncode == 0, result.stderr
    total = 1 + 2 + 4  # ids 0, 1 and the newcomer's 3 (id 2 is not reused), each plus 1
    for rank in (0, 1):
        assert _lines(result.stdout, str(rank)) == ["lost: 2", f"rank {rank} of 3, ranks [0, 1, 3]: sum {total}"]
    assert _lines(result.stdout, "+1") == [f"rank 2 of 3, ranks [0, 1, 3]: sum {total}"]
    assert re.search(r"asyncdist-run: started replacement 1 of 1 \(pid \d+\) for worker rank 2", result.stderr)
    assert "asyncdist-run: finished: rank 0, rank 1, replacement 1; died: rank 2 (SIGKILL)" in result.stderr


def test_a_replacement_never_admitted_is_told_when_the_ranks_have_exited(tmp_path: Path) -> None:
    """The survivors finish without a grow: the launcher closes the waiting room,
    the replacement raises JoinClosedError at once (not at its 30-minute timeout)
    and the launcher exits 0, naming it as never admitted."""
    result = _run(tmp_path, "--on-failure", "continue", "--replace", "1", "job.py")
    assert result.returncode == 0, result.stderr
    for rank in (0, 1):
        assert _lines(result.stdout, str(rank)) == ["lost: 2", f"rank {rank} of 2, ranks [0, 1]: sum {1 + 2}"]
    assert re.search(r"^\[rank \+1\]: asyncdist\.errors\.JoinClosedError: joining process \(pid \d+ on .+\) was "
                     r"never admitted: the running job ended before a grow\(\) took it in \(asyncdist-run: every "
                     r"rank of the job has exited\)$", result.stderr, re.M), result.stderr
    assert "asyncdist-run: replacement 1 was never admitted (the job ended before a grow)" in result.stderr
    assert result.stderr.rstrip().endswith("asyncdist-run: finished: rank 0, rank 1; died: rank 2 (SIGKILL); never "
                                           "admitted (the job ended before a grow): replacement 1"), result.stderr


def test_a_worker_that_raises_fails_a_continuing_job(tmp_path: Path) -> None:
    """An exit with an error code of the worker's own is a failure of the job, not a loss it survives."""
    script = tmp_path / "raise.py"
    script.write_text("import sys\nimport asyncdist as dist\ndist.init_process_group()\n"
                      "sys.exit(3 if dist.get_rank() == 1 else 0)\n")
    result = subprocess.run([*RUN, "--standalone", "--nproc-per-node", "2", "--on-failure", "continue", "raise.py"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=JOB_TIMEOUT, env=ENV)
    assert result.returncode == 1, result.stderr
    assert "asyncdist-run: finished: rank 0; died: rank 1 (exit code 3)" in result.stderr
    assert "the job failed: worker rank 1 exited with code 3" in result.stderr


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--replace", "1"], "--replace needs --on-failure continue"),
        (["--on-failure", "continue", "--replace", "-1"], "--replace must not be negative"),
    ],
)
def test_bad_failure_flags_are_refused(flags: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        config_from_args(build_parser().parse_args([*flags, "job.py"]))


def test_failure_flags_reach_the_config() -> None:
    config = config_from_args(build_parser().parse_args(["--on-failure", "continue", "--replace", "2", "job.py"]))
    assert (config.on_failure, config.replace) == ("continue", 2)
    assert (config_from_args(build_parser().parse_args(["job.py"])).on_failure) == "stop"

"""``asyncdist-run`` and ``python -m asyncdist.launch``, run as real processes on tiny scripts."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

RUN = [sys.executable, "-m", "asyncdist.run"]
# With torch, torch's store is at MASTER_PORT and asyncdist's at ASYNCDIST_STORE_ADDR (docs/launcher.md).
STORE_KIND = "torch" if importlib.util.find_spec("torch") else "asyncdist"
LAUNCH = [sys.executable, "-m", "asyncdist.launch"]
JOB_TIMEOUT = 60  # seconds any launcher run may take before the test fails

# Prints what the launcher told it as JSON, all-reduces its rank, writes to stderr.
ENV_SCRIPT = """
import hashlib, json, os, sys
import numpy as np
import asyncdist as dist

names = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
         "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
         "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE", "ASYNCDIST_JOB_ID", "OMP_NUM_THREADS",
         "ASYNCDIST_AGENT_STORE", "ASYNCDIST_STORE_ADDR"]
env = {name: os.environ.get(name) for name in names}
env["secret_digest"] = hashlib.sha256(os.environ.get("ASYNCDIST_SECRET", "").encode()).hexdigest()
env["argv"] = sys.argv[1:]
dist.init_process_group()
x = np.array([float(dist.get_rank())])
dist.all_reduce(x)
env["sum"] = float(x[0])
print(json.dumps(env))
print(f"stderr line of {dist.get_rank()}", file=sys.stderr)
dist.destroy_process_group()
"""

# Starts a grandchild, reports both pids, then waits to be stopped.
SLEEPER_SCRIPT = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(f"ready pid={os.getpid()} child={child.pid}", flush=True)
time.sleep(600)
"""

# Every rank reports its pids and joins a barrier; then rank 2 raises, the others hang.
FAILING_SCRIPT = """
import os, subprocess, sys, time
import asyncdist as dist
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(f"ready pid={os.getpid()} child={child.pid}", flush=True)
dist.init_process_group()
dist.barrier()
if dist.get_rank() == 2:
    raise ValueError("rank 2 gives up")
time.sleep(600)
"""

# Rank 1 fails on the first attempt only; every attempt rendezvouses through the launcher's store.
RESTART_SCRIPT = """
import os, sys
import asyncdist as dist
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group()
print(f"attempt {attempt}", flush=True)
if dist.get_rank() == 1 and (attempt == 0 or "--always" in sys.argv):
    sys.exit(3)
dist.barrier()
dist.destroy_process_group()
print("finished", flush=True)
"""

HELP_FLAGS = [
    "--nnodes", "--nproc-per-node", "--nproc_per_node", "--node-rank", "--node_rank",
    "--master-addr", "--master_addr", "--master-port", "--master_port", "--standalone",
    "--rdzv-id", "--rdzv_id", "--max-restarts", "--max_restarts", "--role", "-m, --module",
    "--no-python", "--no_python", "--local-ranks-filter", "--local_ranks_filter",
    "--log-line-prefix-template", "--shutdown-timeout", "--log-dir", "--redirects", "--tee", "TRAINING_SCRIPT",
    "--on-failure", "--on_failure", "--replace",
]


def _script(tmp_path: Path, text: str, name: str = "job.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _run(cmd: list[str], tmp_path: Path, env: dict[str, str | None] | None = None) -> subprocess.CompletedProcess:
    """Run a launcher to its end; ``env`` entries set to None are removed. A failed
    job's flight-recorder dumps go under ``tmp_path``, not the system's temporary folder."""
    defaults = {"ASYNCDIST_TRACE_DIR": str(tmp_path / "traces")}
    merged = {name: value for name, value in {**defaults, **os.environ, **(env or {})}.items() if value is not None}
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=JOB_TIMEOUT, env=merged)


def _by_rank(output: str) -> dict[int, list[str]]:
    """Worker lines of the launcher's output, by the rank in their prefix."""
    lines: dict[int, list[str]] = {}
    for line in output.splitlines():
        match = re.fullmatch(r"\[rank (\d+)\]: (.*)", line)
        if match:
            lines.setdefault(int(match[1]), []).append(match[2])
    return lines


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _alive(pid: int) -> bool:
    """True if ``pid`` runs (a zombie, exited but not yet reaped by its parent, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _still_alive(pids: list[int], within: float = 5.0) -> list[int]:
    """The pids that have not exited ``within`` seconds (SIGKILL is delivered asynchronously)."""
    deadline = time.monotonic() + within
    while (alive := [pid for pid in pids if _alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def _ready_pids(lines: dict[int, list[str]]) -> list[int]:
    pids = []
    for rank_lines in lines.values():
        for line in rank_lines:
            if match := re.fullmatch(r"ready pid=(\d+) child=(\d+)", line):
                pids += [int(match[1]), int(match[2])]
    return pids


def test_help_lists_every_flag() -> None:
    # this interpreter's own script first: another Python's on PATH words its help in its own argparse
    script = shutil.which("asyncdist-run", path=os.path.dirname(sys.executable)) or shutil.which("asyncdist-run")
    assert script is not None, "the asyncdist-run console script is not installed"
    result = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=JOB_TIMEOUT)
    assert result.returncode == 0
    missing = [flag for flag in HELP_FLAGS if flag not in result.stdout]
    assert missing == []
    as_module = subprocess.run([*RUN, "--help"], capture_output=True, text=True, timeout=JOB_TIMEOUT)
    assert as_module.stdout == result.stdout


@pytest.mark.parametrize("nproc", [2, 4])
def test_workers_get_torchrun_environment_and_prefixed_output(tmp_path: Path, nproc: int) -> None:
    script = _script(tmp_path, ENV_SCRIPT)
    result = _run([*RUN, "--standalone", "--nproc-per-node", str(nproc), str(script)], tmp_path,
                  env={"OMP_NUM_THREADS": None, "ASYNCDIST_SECRET": None, "ASYNCDIST_JOB_ID": None,
                       "ASYNCDIST_AGENT_STORE": None, "ASYNCDIST_STORE_ADDR": None})
    assert result.returncode == 0, result.stderr
    out, err = _by_rank(result.stdout), _by_rank(result.stderr)
    assert sorted(out) == list(range(nproc))
    envs = {rank: json.loads(lines[0]) for rank, lines in out.items()}
    ports, run_ids, secrets = set(), set(), set()
    for rank, env in envs.items():
        assert env["RANK"] == env["LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == str(nproc)
        assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"], env["ROLE_NAME"]) == ("0", "1", "default")
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert (env["TORCHELASTIC_RESTART_COUNT"], env["TORCHELASTIC_MAX_RESTARTS"]) == ("0", "0")
        assert env["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        assert env["TORCHELASTIC_RUN_ID"] == env["ASYNCDIST_JOB_ID"]
        assert env["OMP_NUM_THREADS"] == "1"  # as torchrun, for more than one worker
        assert env["sum"] == sum(range(nproc))
        assert env["ASYNCDIST_AGENT_STORE"] == STORE_KIND
        if STORE_KIND == "torch":  # asyncdist's own store, on a port of its own
            host, _, port = env["ASYNCDIST_STORE_ADDR"].rpartition(":")
            assert host == "127.0.0.1" and port not in ("0", env["MASTER_PORT"])
        else:
            assert env["ASYNCDIST_STORE_ADDR"] is None
        ports.add(env["MASTER_PORT"])
        run_ids.add(env["TORCHELASTIC_RUN_ID"])
        secrets.add(env["secret_digest"])
        assert err[rank] == [f"stderr line of {rank}"]
    assert len(ports) == len(run_ids) == len(secrets) == 1
    assert int(ports.pop()) not in (0, 29500)  # --standalone: a free port
    assert len(run_ids.pop()) == 32
    assert secrets.pop() != hashlib.sha256(b"").hexdigest()  # a secret was made for the job


def test_asyncdist_store_alone_when_asked(tmp_path: Path) -> None:
    """ASYNCDIST_AGENT_STORE=asyncdist: asyncdist's store at MASTER_PORT, as without torch; an
    ASYNCDIST_STORE_ADDR the launcher inherited (an outer job's, here a dead port) is not passed on."""
    script = _script(tmp_path, ENV_SCRIPT)
    result = _run([*RUN, "--standalone", "--nproc-per-node", "2", str(script)], tmp_path,
                  env={"ASYNCDIST_AGENT_STORE": "asyncdist", "ASYNCDIST_STORE_ADDR": "127.0.0.1:1"})
    assert result.returncode == 0, result.stderr
    envs = [json.loads(lines[0]) for lines in _by_rank(result.stdout).values()]
    assert len(envs) == 2
    for env in envs:
        assert (env["ASYNCDIST_AGENT_STORE"], env["ASYNCDIST_STORE_ADDR"], env["sum"]) == ("asyncdist", None, 1.0)


def test_script_arguments_pass_through(tmp_path: Path) -> None:
    script = _script(tmp_path, "import json, sys; print(json.dumps(sys.argv[1:]))")
    args = ["plain", "with space", "--flag=1", "-x", "rank${local_rank}"]
    result = _run([*RUN, "--standalone", "--nproc_per_node=2", str(script), *args], tmp_path)
    assert result.returncode == 0, result.stderr
    got = {rank: json.loads(lines[0]) for rank, lines in _by_rank(result.stdout).items()}
    assert got == {r: ["plain", "with space", "--flag=1", "-x", f"rank{r}"] for r in (0, 1)}


def test_module_flag_runs_a_module(tmp_path: Path) -> None:
    _script(tmp_path, "import os, sys; print(__name__, os.environ['RANK'], sys.argv[1:])", name="mymod.py")
    result = _run([*RUN, "--standalone", "--nproc-per-node", "2", "-m", "mymod", "arg"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert _by_rank(result.stdout) == {0: ["__main__ 0 ['arg']"], 1: ["__main__ 1 ['arg']"]}


def test_no_python_and_local_ranks_filter(tmp_path: Path) -> None:
    result = _run([*RUN, "--standalone", "--nproc-per-node", "3", "--local-ranks-filter", "0,2",
                   "--log-line-prefix-template", "<${role_name}:${rank}> ", "--role", "trainer",
                   "--no-python", "/bin/sh", "-c", "echo local=$LOCAL_RANK role=$ROLE_NAME"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == ["<trainer:0> local=0 role=trainer",
                                                 "<trainer:2> local=2 role=trainer"]


def test_failing_worker_stops_the_job_and_leaves_no_process(tmp_path: Path) -> None:
    script = _script(tmp_path, FAILING_SCRIPT)
    start = time.monotonic()
    result = _run([*RUN, "--standalone", "--nproc-per-node", "4", str(script)], tmp_path)
    elapsed = time.monotonic() - start
    assert result.returncode == 1
    assert elapsed < 20, f"the launcher took {elapsed:.1f} s to give up"
    assert "asyncdist-run: worker rank 2 exited with code 1" in result.stderr
    assert _first_to_fail(result.stderr) == "worker rank 2 exited with code 1"
    assert "ValueError: rank 2 gives up" in "\n".join(_by_rank(result.stderr)[2])
    pids = _ready_pids(_by_rank(result.stdout))
    assert len(pids) == 8  # 4 workers and their children
    assert _still_alive(pids) == []


def _first_to_fail(stderr: str) -> str:
    """The worker the launcher's summary names as the first to fail, and how it exited:
    the summary's only subject without dumps that name a cause, else the second."""
    match = re.search(r"^asyncdist-run: the job failed: (?:.*; the first worker to fail: )?(worker rank \d+ exited "
                      r"with code -?\d+)", stderr, re.M)
    assert match, stderr
    return match[1]


def _names_rank_1_as_the_cause(stderr: str) -> None:
    """Rank 1 exits with code 3 and says goodbye on its way out, so rank 0's
    barrier fails at about the same moment, often first: the launcher must
    still name rank 1, the one whose failure rank 0 relays."""
    assert "asyncdist-run: worker rank 1 exited with code 3" in stderr, stderr
    assert "asyncdist-run: worker rank 0 exited" not in stderr, stderr


# Rank 1 raises; its exit is slow (an exit hook of its own runs after asyncdist
# has said goodbye), so its peers, failing in the all_reduce, exit first.
RAISING_SCRIPT = """
import atexit, os, time
import numpy as np
import asyncdist as dist
atexit.register(time.sleep, 1.0)  # runs last: after asyncdist's goodbye
dist.init_process_group()
if dist.get_rank() == 1:
    raise ValueError("rank 1 gives up")
dist.all_reduce(np.ones(4))
"""


def test_the_rank_that_raised_is_named_not_the_peers_that_relay_it(tmp_path: Path) -> None:
    script = _script(tmp_path, RAISING_SCRIPT)
    result = _run([*RUN, "--standalone", "--nproc-per-node", "3", str(script)], tmp_path)
    assert result.returncode == 1
    report = [line for line in result.stderr.splitlines() if not line.startswith("[rank")]
    assert any("asyncdist-run: worker rank 1 exited with code 1" in line and "the first to fail" in line
               for line in report), result.stderr
    assert "    ValueError: rank 1 gives up" in report, result.stderr  # its last words, repeated
    # The dumps of ranks 0 and 2 (lost their peer in the all_reduce) name rank 1 as well.
    assert re.search(r"^asyncdist-run: the job failed: rank 1 died: .*; ranks \[0, 2\] waited for it in call #1 "
                     r"of group world \(all_reduce\(sum, float64\[4\]\)\)", result.stderr, re.M), result.stderr
    assert _first_to_fail(result.stderr) == "worker rank 1 exited with code 1"
    assert not re.search(r"asyncdist-run: worker rank [02] exited", result.stderr), result.stderr


# Rank 2 waits in user code for something that never comes; ranks 0 and 1 time
# out in the next all_reduce (their hang warning asks rank 2 where it is first, and
# its dump holds its stack: the summary says where it waits).
STUCK_CALLS = 6  # all_reduces every rank completes, after init's barrier (call #0)
STUCK_SCRIPT = f"""
import threading
from datetime import timedelta
import numpy as np
import asyncdist as dist
dist.init_process_group(timeout=timedelta(seconds=3))
x = np.ones(4)
for _ in range({STUCK_CALLS}):
    dist.all_reduce(x)
if dist.get_rank() == 2:
    threading.Event().wait()
dist.all_reduce(x)
"""


def test_the_rank_the_dumps_find_behind_is_named_before_the_first_to_exit(tmp_path: Path) -> None:
    script = _script(tmp_path, STUCK_SCRIPT)
    result = _run([*RUN, "--standalone", "--nproc-per-node", "3", str(script)], tmp_path,
                  env={"ASYNCDIST_HANG_WARN": "1", "ASYNCDIST_AGENT_STORE": "asyncdist"})
    assert result.returncode == 1, result.stderr
    summary = [line for line in result.stderr.splitlines() if line.startswith("asyncdist-run: the job failed: ")]
    assert len(summary) == 1, result.stderr
    # Rank 2 completed call #STUCK_CALLS and never entered the next, which ranks 0 and 1 timed out in.
    match = re.fullmatch(
        rf"asyncdist-run: the job failed: rank 2 is behind on group world: it is at all_reduce #{STUCK_CALLS} "
        rf"on group world \(.*\), while ranks \[0, 1\] wait in call #{STUCK_CALLS + 1} \(.*\); "
        r"rank 2's main thread is in job\.py:11 in <module> \(threading\.Event\(\)\.wait\(\)\), outside any "
        r"asyncdist call \(from the flight-recorder dumps\); the first worker to fail: worker rank ([01]) exited "
        r"with code 1 .*",
        summary[0])
    assert match, summary[0]
    assert f"worker rank {match[1]} exited with code 1" in result.stderr  # the launcher saw it exit first


def test_max_restarts_restarts_the_group(tmp_path: Path) -> None:
    script = _script(tmp_path, RESTART_SCRIPT)
    result = _run([*RUN, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", str(script)], tmp_path)
    assert result.returncode == 0, result.stderr
    _names_rank_1_as_the_cause(result.stderr)
    assert "restarting the worker group (1 of 1 restarts)" in result.stderr
    lines = _by_rank(result.stdout)
    assert lines[1] == ["attempt 0", "attempt 1", "finished"]
    assert lines[0][0] == "attempt 0" and lines[0][-2:] == ["attempt 1", "finished"]


def test_restarts_run_out(tmp_path: Path) -> None:
    script = _script(tmp_path, RESTART_SCRIPT)
    result = _run([*RUN, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", str(script), "--always"],
                  tmp_path)
    assert result.returncode == 1
    _names_rank_1_as_the_cause(result.stderr)
    assert _first_to_fail(result.stderr) == "worker rank 1 exited with code 3"
    assert "after 1 restarts" in result.stderr
    assert _by_rank(result.stdout)[1] == ["attempt 0", "attempt 1"]


def _start_sleepers(tmp_path: Path, nproc: int) -> tuple[subprocess.Popen, list[int]]:
    """A launcher running ``nproc`` sleepers, once every one reported its pids."""
    script = _script(tmp_path, SLEEPER_SCRIPT)
    launcher = subprocess.Popen([*RUN, "--standalone", "--nproc-per-node", str(nproc), str(script)],
                                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: dict[int, list[str]] = {}
    assert launcher.stdout is not None
    try:
        while len(_ready_pids(lines)) < 2 * nproc:  # readline returns "" if the launcher dies
            line = launcher.stdout.readline()
            assert line, f"the launcher ended early: {launcher.stderr.read() if launcher.stderr else ''}"
            for rank, got in _by_rank(line).items():
                lines.setdefault(rank, []).extend(got)
    except BaseException:
        launcher.kill()
        launcher.communicate(timeout=JOB_TIMEOUT)
        raise
    return launcher, _ready_pids(lines)


@pytest.mark.timeout(JOB_TIMEOUT)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_launcher_stops_every_worker(tmp_path: Path, signum: int) -> None:
    launcher, pids = _start_sleepers(tmp_path, 2)
    try:
        launcher.send_signal(signum)
        _, err = launcher.communicate(timeout=JOB_TIMEOUT)
    finally:
        launcher.kill()
    assert launcher.returncode == 128 + signum
    assert f"received {signal.Signals(signum).name}; stopping the workers" in err
    assert _still_alive(pids) == []
    if signum == signal.SIGINT:  # forwarded: Python workers see a KeyboardInterrupt
        assert "KeyboardInterrupt" in "\n".join(_by_rank(err)[0])


@pytest.mark.timeout(JOB_TIMEOUT)
def test_workers_die_with_a_killed_launcher(tmp_path: Path) -> None:
    launcher, pids = _start_sleepers(tmp_path, 2)
    launcher.kill()  # SIGKILL: no clean-up code runs in the launcher
    launcher.communicate(timeout=JOB_TIMEOUT)
    workers = pids[0::2]
    assert _still_alive(workers) == []  # PR_SET_PDEATHSIG
    for child in pids[1::2]:  # orphaned grandchildren are out of reach; end them here
        os.kill(child, signal.SIGKILL)


def test_two_nodes_share_node_zeros_store(tmp_path: Path) -> None:
    script = _script(tmp_path, ENV_SCRIPT)
    port = _free_port()
    env = {**os.environ, "ASYNCDIST_SECRET": "the-same-on-every-node"}
    nodes = [
        subprocess.Popen([*RUN, "--nnodes", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1",
                          "--master-port", str(port), "--nproc-per-node", "2", "--rdzv-id", "job42", str(script)],
                         cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for node in (1, 0)  # node 1 first: its launcher waits for node 0's store
    ]
    try:
        outputs = [node.communicate(timeout=JOB_TIMEOUT) for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    assert [node.returncode for node in nodes] == [0, 0], [err for _, err in outputs]
    envs = {rank: json.loads(lines[0]) for out, _ in outputs for rank, lines in _by_rank(out).items()}
    assert sorted(envs) == [0, 1, 2, 3]
    for rank, env in envs.items():
        assert (env["RANK"], env["LOCAL_RANK"], env["GROUP_RANK"]) == (str(rank), str(rank % 2), str(rank // 2))
        assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["GROUP_WORLD_SIZE"]) == ("4", "2", "2")
        assert (env["MASTER_PORT"], env["TORCHELASTIC_RUN_ID"], env["ASYNCDIST_JOB_ID"]) == (str(port), "job42", "job42")
        assert env["sum"] == 6.0


@pytest.mark.parametrize("use_env", [False, True])
def test_deprecated_launch(tmp_path: Path, use_env: bool) -> None:
    script = _script(tmp_path, "import json, os, sys; print(json.dumps([os.environ['LOCAL_RANK'], sys.argv[1:]]))")
    flags = ["--use_env"] if use_env else []
    result = _run([*LAUNCH, "--nproc_per_node=2", f"--master_port={_free_port()}", *flags, str(script), "x"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "deprecated" in result.stderr
    got = {rank: json.loads(lines[0]) for rank, lines in _by_rank(result.stdout).items()}
    if use_env:
        assert got == {0: ["0", ["x"]], 1: ["1", ["x"]]}
    else:
        assert got == {0: ["0", ["--local_rank=0", "x"]], 1: ["1", ["--local_rank=1", "x"]]}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--nnodes", "1:2"], "elastic rendezvous"),
        (["--nnodes", "2", "--node-rank", "2"], "--node-rank must be in [0, 2)"),
        (["--nnodes", "2", "--standalone"], "--standalone is for a single node"),
        (["--nproc-per-node", "many"], "must be a positive integer, cpu, gpu or auto"),
    ],
)
def test_bad_flags_are_usage_errors(tmp_path: Path, flags: list[str], message: str) -> None:
    result = _run([*RUN, *flags, "job.py"], tmp_path)
    assert result.returncode == 2
    assert message in result.stderr


def test_store_port_in_use_is_reported(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _run([*RUN, "--master-port", str(port), "job.py"], tmp_path)
    assert result.returncode == 1
    assert f"asyncdist-run: error: cannot serve the job's store on 127.0.0.1:{port}" in result.stderr


@pytest.mark.parametrize(
    ("flag", "instead"),
    [
        (["--rdzv-backend", "c10d"], "--master-addr and --master-port"),
        (["--rdzv_endpoint=10.0.0.1:29400"], "--master-addr HOST --master-port PORT"),
        (["--start-method", "fork"], "always new processes"),
        (["--monitor-interval", "5"], "drop the flag"),
    ],
)
def test_torchrun_flags_not_implemented_are_named_with_what_to_use(tmp_path: Path, flag: list[str],
                                                                   instead: str) -> None:
    result = _run([*RUN, *flag, "job.py"], tmp_path)
    assert result.returncode == 2
    name = flag[0].partition("=")[0]
    assert f"{name} is torchrun's, and asyncdist-run does not implement it: " in result.stderr, result.stderr
    assert instead in result.stderr, result.stderr


def test_redirects_tee_and_log_dir(tmp_path: Path) -> None:
    script = _script(tmp_path, """
        import os, sys
        print(f"out of {os.environ['LOCAL_RANK']}", flush=True)
        print(f"err of {os.environ['LOCAL_RANK']}", file=sys.stderr, flush=True)
    """)
    logs = tmp_path / "logs"
    # local rank 0: stdout to its file only; local rank 1: stderr to its file and the console
    result = _run([*RUN, "--nproc-per-node", "2", "--rdzv-id", "run7", "--log-dir", str(logs),
                   "--redirects", "0:1", "--tee", "1:2", str(script)], tmp_path)
    assert result.returncode == 0, result.stderr
    assert _by_rank(result.stdout) == {1: ["out of 1"]}  # rank 0's stdout went to its file only
    assert _by_rank(result.stderr) == {0: ["err of 0"], 1: ["err of 1"]}
    attempt = logs / "run7" / "attempt_0"
    assert (attempt / "0" / "stdout.log").read_text() == "out of 0\n"
    assert (attempt / "1" / "stderr.log").read_text() == "err of 1\n"
    assert sorted(p.relative_to(attempt).as_posix() for p in attempt.rglob("*.log")) == [
        "0/stdout.log", "1/stderr.log"]


def test_node_zero_names_the_ranks_that_have_not_joined(tmp_path: Path) -> None:
    # Node 1 never starts: node 0's worker waits for rank 1, and its launcher,
    # which serves the store, says whom the job waits for and on which node.
    script = _script(tmp_path, "from datetime import timedelta\nimport asyncdist as dist\n"
                               "dist.init_process_group(timeout=timedelta(seconds=2))\n")
    env = {**os.environ, "ASYNCDIST_SECRET": "s", "ASYNCDIST_INIT_REPORT_EVERY": "0.4"}
    result = subprocess.run([*RUN, "--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port",
                             str(_free_port()), "--nproc-per-node", "1", "--rdzv-id", "j", str(script)],
                            cwd=tmp_path, capture_output=True, text=True, env=env, timeout=JOB_TIMEOUT)
    assert result.returncode != 0  # the worker timed out
    lines = [line for line in result.stderr.splitlines() if line.startswith("asyncdist-run: waiting for")]
    assert lines, result.stderr
    assert all(re.fullmatch(r"asyncdist-run: waiting for rank 1 of 2 \(on node 1\) to join the rendezvous "
                            r"\(\d+ s so far\)", line) for line in lines), lines

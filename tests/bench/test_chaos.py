"""The chaos benchmark in CI form: SIGKILLed ranks, replacements, and the final weights checked.

Timing-free: each run kills two members, each kill only once the previous one
was recovered from and its replacement admitted (``settle``), and asserts
that every finishing worker's weights equal the sequential reference for its
step count, that every kill was recovered from and every replacement admitted,
and that no process is left. Never a speed.
"""

from __future__ import annotations

import io
import os
import queue
import time
from types import SimpleNamespace

import numpy as np
import pytest

from asyncdist.bench import chaos, chaos_cluster as cluster, chaos_driver
from asyncdist.bench.chaos_model import Model, apply, grad, matches, references


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _chaos(path: str, ranks: int) -> chaos.PathResult:
    opts = chaos.Options(ranks=ranks, duration=0.5, rounds=1, interval=0.2, kills=2, settle=True, baseline=0, seed=3,
                         model=Model(hidden=16, seed=3))
    [result] = chaos.run([path], opts, log=io.StringIO())
    run = result.faulty
    assert run is not None and result.clean is None
    assert [pid for pid in run.pids if not _gone(pid)] == []
    assert len(run.kills) == 2 and len(run.pids) == ranks + 2
    assert all(k.recovery is not None for k in run.kills), run.kills
    if path == "asyncdist":  # torchft's survivor may never fail a step: its next quorum leaves the dead out
        assert all(k.detection is not None and k.new_group is not None for k in run.kills), run.kills
    assert len(run.admissions) == 2
    assert len(run.weights) == ranks and min(steps for steps, _ in run.weights) > 0
    expected = references(opts.model, sorted({steps for steps, _ in run.weights}))
    for steps, weights in run.weights:
        np.testing.assert_allclose(weights, expected[steps], rtol=1e-9, atol=1e-12)
    assert result.passed is True
    return result


def test_asyncdist_shrinks_and_grows_through_two_kills():
    result = _chaos("asyncdist", ranks=3)
    assert "PASS" in "\n".join(chaos.table([result], chaos.Options()))


# Each waits out torchft's lighthouse heartbeat per kill (about 30 s of the suite's time):
# the long runs (-m soak); tests/torchft/test_manager.py runs the Manager over asyncdist in the suite.
@pytest.mark.soak
@pytest.mark.timeout(300)
def test_torchft_manager_over_its_gloo_group_through_two_kills():
    pytest.importorskip("torchft")
    _chaos("torchft-gloo", ranks=2)


# Each waits out torchft's lighthouse heartbeat per kill (about 30 s of the suite's time):
# the long runs (-m soak); tests/torchft/test_manager.py runs the Manager over asyncdist in the suite.
@pytest.mark.soak
@pytest.mark.timeout(300)
def test_torchft_manager_over_asyncdist_through_two_kills():
    pytest.importorskip("torchft")
    pytest.importorskip("asyncdist.torchft", exc_type=ImportError)
    _chaos("torchft-asyncdist", ranks=2)


def test_the_reference_tells_a_lost_or_repeated_step():
    model = Model(hidden=8, seed=1)
    params = model.init()
    for step, size in enumerate([3, 3, 2, 2, 4, 1, 3]):  # the group's size changes; the update does not
        apply(model, params, sum(grad(model, params, step, rank, size) for rank in range(size)))
    expected = references(model, [6, 7, 8])
    assert matches(params, expected[7])
    assert not matches(params, expected[6]) and not matches(params, expected[8])


def test_a_path_that_is_not_installed_is_reported_not_available(monkeypatch):
    monkeypatch.setattr(chaos.importlib.util, "find_spec", lambda name: None)
    assert chaos.available("asyncdist") is None
    assert "torchft is not installed" in str(chaos.available("torchft-gloo"))
    row = chaos.table([chaos.PathResult("torchft-gloo", missing=chaos.available("torchft-gloo"))], chaos.Options())
    assert "not available: torchft is not installed" in row[-1]


def test_path_b_is_not_available_when_asyncdist_torchft_does_not_import(monkeypatch):
    def no_module(name):
        raise ModuleNotFoundError(f"No module named {name!r}")

    monkeypatch.setattr(chaos.importlib.util, "find_spec", lambda name: object())  # torchft is installed
    monkeypatch.setattr(chaos.importlib, "import_module", no_module)
    assert chaos.available("torchft-gloo") is None
    assert chaos.available("torchft-asyncdist") == (
        "asyncdist.torchft does not import here (No module named 'asyncdist.torchft')")


def test_ci_flags_fill_what_is_not_given():
    parser = chaos.build_parser("chaos")
    opts = chaos.options(parser.parse_args(["--ci", "--ranks", "4"]))
    assert (opts.ranks, opts.kills, opts.settle, opts.duration, opts.rounds) == (4, 2, True, 3.0, 1)
    opts = chaos.options(parser.parse_args([]))
    assert (opts.ranks, opts.kills, opts.settle, opts.interval, opts.duration, opts.rounds) == (
        8, None, False, 10.0, 180.0, 3)
    assert parser.parse_args(["--paths", "a,c"]).paths == ["asyncdist", "torchft-gloo"]


def test_rounds_alternate_and_add_up(monkeypatch):
    calls = []

    def fake_run(path, opts, faults, duration):
        calls.append((faults, duration, opts.kills))
        kills = [chaos.Kill(slot=0)] * (1 if faults else 0)
        return chaos.Run(steps=100 if faults else 120, seconds=duration, kills=kills, startups=[0.5] * len(kills),
                         admissions=[], weights=[(100, np.zeros(1))], pids=[len(calls)])

    monkeypatch.setattr(chaos, "run_path", fake_run)
    opts = chaos.Options(duration=90.0, baseline=60.0, rounds=3, kills=2)
    faulty, clean = chaos.run_rounds("asyncdist", opts, log=io.StringIO())
    # with, without; without, with; with, without: a drift over the run weighs on both alike
    assert [faults for faults, _, _ in calls] == [True, False, False, True, True, False]
    assert [d for f, d, _ in calls if f] == [30.0] * 3 and [d for f, d, _ in calls if not f] == [20.0] * 3
    assert [k for f, _, k in calls if f] == [2, 1, 0]  # --kills bounds all the parts together
    assert (faulty.steps, faulty.seconds, len(faulty.kills), faulty.pids) == (300, 90.0, 3, [1, 4, 5])
    assert (clean.steps, clean.seconds, clean.rate) == (360, 60.0, 6.0)


class _Worker(SimpleNamespace):
    __eq__, __hash__ = object.__eq__, object.__hash__  # a worker is a process: compared by identity


class _SilentCluster:
    """A cluster whose workers start and are replaced, but whose survivors never report a recovery."""

    def __init__(self, path, model_json, timeout, heartbeat_ms):
        self.path, self.folder, self.workers = path, "/nonexistent", []
        self.events = queue.Queue()

    def _worker(self, slot):
        worker = _Worker(slot=slot, started=time.monotonic(), proc=SimpleNamespace(pid=0, returncode=None))
        self.workers.append(worker)
        return worker

    def start(self, n):
        for slot in range(n):
            self.events.put(cluster.Event(self._worker(slot), {"event": "ready", "t": time.monotonic()}))

    def kill(self, worker):
        return time.monotonic()

    def replace(self, dead):
        worker = self._worker(dead.slot)
        for name in ("joining", "admitted"):
            self.events.put(cluster.Event(worker, {"event": name, "t": time.monotonic()}))
        return worker

    def tell_all(self, line):
        pass

    def announce(self):
        pass

    def close(self):
        pass


def test_a_kill_never_recovered_from_fails_the_run_instead_of_waiting_forever(monkeypatch):
    monkeypatch.setattr(chaos_driver, "Cluster", _SilentCluster)
    monkeypatch.setattr(chaos_driver, "_PATIENCE", 0.5)
    opts = chaos.Options(ranks=2, duration=0.1, rounds=1, interval=0.05, kills=1, settle=True, baseline=0)
    with pytest.raises(RuntimeError, match=r"the kill of slot \d not recovered from, 0.5 s after the run's end"):
        chaos.run_path("torchft-asyncdist", opts, faults=True, duration=opts.duration)

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

import numpy as np
import pytest

from asyncdist.bench import chaos
from asyncdist.bench.chaos_model import Model, apply, grad, matches, references


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _chaos(path: str, ranks: int) -> chaos.PathResult:
    opts = chaos.Options(ranks=ranks, duration=0.5, interval=0.2, kills=2, settle=True, baseline=0, seed=3,
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
    assert (opts.ranks, opts.kills, opts.settle, opts.duration) == (4, 2, True, 3.0)
    opts = chaos.options(parser.parse_args([]))
    assert (opts.ranks, opts.kills, opts.settle, opts.interval, opts.duration) == (8, None, False, 10.0, 180.0)
    assert parser.parse_args(["--paths", "a,c"]).paths == ["asyncdist", "torchft-gloo"]

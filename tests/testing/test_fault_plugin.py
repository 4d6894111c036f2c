"""The plugin's fault plans as a user meets them: the ``asyncdist`` marker, the ``faults``
fixture, and a failing random plan replayed from its seed (``--asyncdist-seed``, ``ASYNCDIST_SEED``)."""

from __future__ import annotations

import re
import zlib

import pytest

from asyncdist import settings

pytest_plugins = ["pytester"]

RUN_TIMEOUT = 120
INI = """
[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
addopts = --strict-markers -p no:cacheprovider -p no:randomly
"""

FIXED = '''
import asyncio
import numpy as np
import pytest
from asyncdist.errors import PeerLostError
from asyncdist.testing.faults import FaultPlan
from asyncdist.testing.injector import RankKilled


async def sums(g, count):
    out = []
    for _ in range(count):
        x = np.full(2, float(g.rank + 1))
        await g.all_reduce(x)
        out.append(float(x[0]))
    return out


@pytest.mark.asyncdist(world_size=3, faults="kill 2 at all_reduce#2")
async def test_in_one_loop(local_ranks, world_size, faults):
    assert world_size == 3 and faults.faults == FaultPlan.parse("kill 2 at all_reduce#2").faults
    assert str(faults) == f"seed {faults.seed}; kill 2 at all_reduce#2"  # the test's seed, for jitter
    outcomes = await asyncio.gather(*(sums(g, 3) for g in local_ranks), return_exceptions=True)
    assert outcomes[2] == RankKilled(2, "all_reduce#2")
    assert [(type(o), o.rank) for o in outcomes[:2]] == [(PeerLostError, 2)] * 2


def test_no_marker(faults, request):
    assert not faults and faults.seed == SEED_OF_NO_MARKER


async def test_no_plan_is_left_behind(local_ranks):
    from asyncdist.testing.injector import installed
    assert installed() is None
    assert await asyncio.gather(*(sums(g, 2) for g in local_ranks)) == [[3.0, 3.0]] * 2


# The default heartbeat (a peer silent for 30 s is lost), on virtual time: no real wait.
@pytest.mark.asyncdist(world_size=2, faults="cut 0-1 at all_reduce#2 for 600s", virtual_time=True)
async def test_a_cut_link_on_virtual_time(local_ranks):
    from asyncdist.testing import is_virtual
    assert is_virtual()
    loop = asyncio.get_running_loop()
    began = loop.time()
    outcomes = await asyncio.gather(*(sums(g, 3) for g in local_ranks), return_exceptions=True)
    assert [(type(o), o.rank) for o in outcomes] == [(PeerLostError, 1), (PeerLostError, 0)]
    assert all("(heartbeat timeout 30 s)" in str(o) for o in outcomes)
    assert 30 <= loop.time() - began < 40
'''


@pytest.mark.timeout(RUN_TIMEOUT)
def test_a_marked_plan_runs_under_local_ranks(pytester: pytest.Pytester) -> None:
    """(``spawn_ranks`` runs the marked plan too: spawn passes on the installed plan,
    see test_fault_processes.py.)"""
    pytester.makeini(INI)
    nodeid = "test_fixed.py::test_no_marker"
    pytester.makepyfile(test_fixed=FIXED.replace("SEED_OF_NO_MARKER", str(zlib.crc32(nodeid.encode()))))
    pytester.runpytest_inprocess().assert_outcomes(passed=4)


BUGGY = '''
import asyncio
import numpy as np
import pytest
from asyncdist.errors import PeerLostError
from asyncdist.reduce.op import ReduceOp

STEPS, BATCH, LR = 4, 12, 0.1
FEATURES = np.random.default_rng(1234).normal(size=(64, 4))
TARGETS = FEATURES @ np.array([1.0, -2.0, 0.5, 3.0])


def gradients(params, samples):
    x, y = FEATURES[samples], TARGETS[samples]
    error = x[:, :2] @ params[0] + x[:, 2:] @ params[1] - y
    return [x[:, :2].T @ error, x[:, 2:].T @ error]


def batch(step):
    return np.random.default_rng(step).permutation(len(FEATURES))[:BATCH]


async def train(g):
    params, step = [np.zeros(2), np.zeros(2)], 0
    while step < STEPS:
        try:
            for p, grad in zip(params, gradients(params, batch(step)[g.rank::g.size])):
                await g.all_reduce(grad)
                p -= LR * grad / BATCH
            step += 1
        except PeerLostError:
            g = await g.shrink()
            redo = np.array([step])
            await g.all_reduce(redo, op=ReduceOp.MIN)
            step = int(redo[0])  # the bug: the parameters are not restored
    await g.close()
    return params


@pytest.mark.asyncdist(world_size=3, kinds=["kill"], ops=["all_reduce"], max_count=8)
async def test_training_survives_a_kill(local_ranks):
    params = [np.zeros(2), np.zeros(2)]
    for step in range(STEPS):
        for p, grad in zip(params, gradients(params, batch(step))):
            p -= LR * grad / BATCH
    outcomes = await asyncio.gather(*(train(g) for g in local_ranks), return_exceptions=True)
    got = outcomes[0]
    assert np.allclose(got[0], params[0]) and np.allclose(got[1], params[1]), f"got {got}, expected {params}"
'''


def _plan_section(lines: list[str]) -> list[str]:
    start = next(i for i, line in enumerate(lines) if "asyncdist fault plan" in line)
    return lines[start + 1 : start + 3]


@pytest.mark.timeout(2 * RUN_TIMEOUT)
def test_a_failing_random_plan_is_printed_and_replays_from_its_seed(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytester.makeini(INI)
    pytester.makepyfile(test_buggy=BUGGY)
    # Seed 2 draws "kill 1 at all_reduce#6": between a step's two reductions, which finds the bug.
    failed = pytester.runpytest_inprocess("--asyncdist-seed=2")
    failed.assert_outcomes(failed=1)
    section = _plan_section(failed.outlines)
    assert section == [
        "seed 2; kill 1 at all_reduce#6",
        "replay: pytest 'test_buggy.py::test_training_survives_a_kill[3ranks]' --asyncdist-seed=2",
    ]
    # The assertion's own line (the short summary repeats it, cut to the terminal's width outside CI).
    wrong = [line for line in failed.outlines if re.match(r"E\s+AssertionError: got \[", line)]
    assert len(wrong) == 1
    # The environment variable replays it too: the same plan, the same wrong parameters.
    monkeypatch.setenv("ASYNCDIST_SEED", "2")
    settings.refresh()
    again = pytester.runpytest_inprocess()
    again.assert_outcomes(failed=1)
    assert _plan_section(again.outlines) == section
    assert [line for line in again.outlines if re.match(r"E\s+AssertionError: got \[", line)] == wrong
    # Seed 4 draws "kill 2 at all_reduce#7", at a step's first reduction: the bug stays hidden.
    monkeypatch.delenv("ASYNCDIST_SEED")
    settings.refresh()
    pytester.runpytest_inprocess("--asyncdist-seed=4").assert_outcomes(passed=1)


ORDER = '''
import pytest


@pytest.mark.asyncdist(world_size=4, kinds=["kill", "cut", "delay"], count=2)
def test_a(faults):
    assert False, str(faults)


@pytest.mark.asyncdist(world_size=4, kinds=["kill", "cut", "delay"], count=2)
def test_b(faults):
    assert False, str(faults)
'''


@pytest.mark.timeout(RUN_TIMEOUT)
def test_a_tests_plan_does_not_depend_on_what_ran_before(pytester: pytest.Pytester) -> None:
    pytester.makeini(INI)
    pytester.makepyfile(test_order=ORDER)

    def plans(*args: str) -> dict[str, str]:
        found, test = {}, ""
        for line in pytester.runpytest_inprocess(*args).outlines:
            if header := re.fullmatch(r"_+ (test_\w)\[4ranks\] _+", line):
                test = header[1]
            elif message := re.fullmatch(r"E +AssertionError: (seed .*)", line):
                found[test] = message[1]
        return found

    both = plans()
    assert sorted(both) == ["test_a", "test_b"] and both["test_a"] != both["test_b"]
    assert plans("-k", "test_b") == {"test_b": both["test_b"]}
    assert plans("test_order.py::test_b", "test_order.py::test_a") == both
    assert all(re.fullmatch(r"seed \d+; \w+ .*; \w+ .*", p) for p in both.values())


@pytest.mark.timeout(RUN_TIMEOUT)
@pytest.mark.parametrize("marker, error", [
    ("asyncdist('kill 1 at any#1')", "takes keywords only"),
    ("asyncdist(world_size=2, faults='explode')", "cannot read 'explode'"),
    ("asyncdist(world_size=2, faults='kill 1 at any#1', kinds=['kill'])", "needs a world size and no faults="),
    ("asyncdist(world_size=2, faults='kill 1 at any#1', ops=['send'])", "only go with kinds="),
])  # fmt: skip
def test_a_bad_marker_says_what_is_wrong(pytester: pytest.Pytester, marker: str, error: str) -> None:
    pytester.makeini(INI)
    pytester.makepyfile(test_bad=f"""
        import pytest

        @pytest.mark.{marker}
        def test_x(faults):
            pass
    """)
    result = pytester.runpytest_inprocess()
    assert result.ret != 0
    assert any(error in line for line in result.outlines), result.outlines

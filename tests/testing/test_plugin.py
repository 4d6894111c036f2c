"""The pytest plugin, as a user meets it: a test file of theirs run by pytest (through ``pytester``).

Each run is a fresh pytest process, so the plugin is found through its
``pytest11`` entry point, as in a user's project, and the rank processes of
``spawn_ranks`` can import the user's test module.
"""

from __future__ import annotations

import textwrap

import pytest

pytest_plugins = ["pytester"]

RUN_TIMEOUT = 240  # seconds one pytest run of a user's file may take

# A user's test file, written against the documented plugin only. {asyncio_mark}
# is "@pytest.mark.asyncio" for strict mode and empty for auto mode.
USER_TESTS = '''
import asyncio
import os

import numpy as np
import pytest

import asyncdist as dist


@pytest.mark.world_size(2, 4)
{asyncio_mark}
async def test_all_reduce_in_one_loop(local_ranks, world_size):
    assert [g.rank for g in local_ranks] == list(range(world_size))
    assert {{g.size for g in local_ranks}} == {{world_size}}
    arrays = [np.full(3, float(g.rank + 1)) for g in local_ranks]
    await asyncio.gather(*(g.all_reduce(a) for g, a in zip(local_ranks, arrays)))
    total = world_size * (world_size + 1) / 2
    assert [a.tolist() for a in arrays] == [[total] * 3] * world_size


@pytest.mark.world_size(2, 4)
{asyncio_mark}
async def test_ring_in_one_loop(local_ranks, world_size):
    got = [np.zeros(1) for _ in local_ranks]

    async def step(g):
        right, left = (g.rank + 1) % world_size, (g.rank - 1) % world_size
        await asyncio.gather(g.send(np.array([float(g.rank)]), right), g.recv(got[g.rank], left))

    await asyncio.gather(*(step(g) for g in local_ranks))
    assert [float(x[0]) for x in got] == [float((r - 1) % world_size) for r in range(world_size)]


def rank_body(scale):
    dist.init_process_group()
    x = np.array([float(dist.get_rank() * scale)])
    dist.all_reduce(x)
    return dist.get_rank(), dist.get_world_size(), float(x[0]), os.environ["LOCAL_RANK"]


@pytest.mark.world_size(2, 4)
def test_all_reduce_as_processes(spawn_ranks, world_size):
    total = 10.0 * sum(range(world_size))
    assert spawn_ranks(rank_body, 10) == [(r, world_size, total, str(r)) for r in range(world_size)]


def failing_body():
    dist.init_process_group()
    if dist.get_rank() == 1:
        raise ValueError("rank 1 refuses")
    dist.barrier()  # rank 1 is gone: this rank's own error comes after rank 1's


@pytest.mark.world_size(2)
def test_a_rank_error_is_reraised_with_rank_and_traceback(spawn_ranks):
    with pytest.raises(ValueError, match="rank 1 refuses") as info:
        spawn_ranks(failing_body, timeout=60)
    assert "(raised on rank 1 of 2)" in info.value.__notes__
    assert "in failing_body" in str(info.value.__cause__)


def lock_body():
    import threading
    return threading.Lock()


@pytest.mark.world_size(2)
def test_an_unpicklable_result_is_reported(spawn_ranks):
    with pytest.raises(TypeError, match="the return value of lock_body cannot be pickled"):
        spawn_ranks(lock_body, timeout=60)


def sleeping_body():
    import time
    time.sleep(600)


@pytest.mark.world_size(2)
def test_spawn_timeout(spawn_ranks):
    from asyncdist.errors import DistTimeoutError
    with pytest.raises(DistTimeoutError, match=r"ranks \\[0, 1\\] did not finish within 3 s"):
        spawn_ranks(sleeping_body, timeout=3)


@pytest.mark.world_size(3)
class TestClassMarker:
    def test_size_from_class(self, world_size):
        assert world_size == 3

    @pytest.mark.world_size(1)
    def test_closest_marker_wins(self, world_size):
        assert world_size == 1


def test_default_world_size(world_size):
    assert world_size == 2


@pytest.mark.parametrize("world_size", [3])
{asyncio_mark}
async def test_parametrized_directly(local_ranks, world_size):
    assert len(local_ranks) == 3
'''

INI = """
[pytest]
asyncio_mode = {mode}
asyncio_default_fixture_loop_scope = function
addopts = --strict-markers -p no:cacheprovider -p no:randomly
filterwarnings = error
"""

EXPECTED_IDS = [
    "*test_all_reduce_in_one_loop[[]2ranks[]] PASSED*",
    "*test_all_reduce_in_one_loop[[]4ranks[]] PASSED*",
    "*test_ring_in_one_loop[[]2ranks[]] PASSED*",
    "*test_ring_in_one_loop[[]4ranks[]] PASSED*",
    "*test_all_reduce_as_processes[[]2ranks[]] PASSED*",
    "*test_all_reduce_as_processes[[]4ranks[]] PASSED*",
    "*test_a_rank_error_is_reraised_with_rank_and_traceback[[]2ranks[]] PASSED*",
    "*test_an_unpicklable_result_is_reported[[]2ranks[]] PASSED*",
    "*test_spawn_timeout[[]2ranks[]] PASSED*",
    "*TestClassMarker::test_size_from_class[[]3ranks[]] PASSED*",
    "*TestClassMarker::test_closest_marker_wins[[]1ranks[]] PASSED*",
    "*test_default_world_size PASSED*",
    "*test_parametrized_directly[[]3[]] PASSED*",
]


@pytest.mark.timeout(2 * RUN_TIMEOUT)
@pytest.mark.parametrize("mode", ["auto", "strict"])
def test_users_test_file_passes(pytester: pytest.Pytester, mode: str) -> None:
    mark = "@pytest.mark.asyncio" if mode == "strict" else ""
    pytester.makeini(INI.format(mode=mode))
    pytester.makepyfile(test_user=USER_TESTS.format(asyncio_mark=mark))
    result = pytester.runpytest_subprocess("-v", timeout=RUN_TIMEOUT)
    result.assert_outcomes(passed=len(EXPECTED_IDS))
    result.stdout.fnmatch_lines(EXPECTED_IDS)
    assert "asyncdist" in "\n".join(result.outlines[:10])  # listed among the loaded plugins


@pytest.mark.timeout(RUN_TIMEOUT)
def test_async_test_without_mark_in_strict_mode_is_not_run_as_asyncio(pytester: pytest.Pytester) -> None:
    """Strict mode keeps its rule for local_ranks tests: no asyncio mark, no event loop."""
    pytester.makeini(INI.format(mode="strict").replace("filterwarnings = error", ""))
    pytester.makepyfile(test_user=textwrap.dedent("""
        import pytest

        @pytest.mark.world_size(2)
        async def test_unmarked(local_ranks):
            pass
    """))
    result = pytester.runpytest_subprocess(timeout=RUN_TIMEOUT)
    assert result.ret != 0
    assert result.parseoutcomes().get("passed", 0) == 0


@pytest.mark.timeout(RUN_TIMEOUT)
@pytest.mark.parametrize("marker", ["world_size()", "world_size(0)", "world_size(2, '4')"])
def test_bad_marker_is_a_usage_error(pytester: pytest.Pytester, marker: str) -> None:
    pytester.makeini(INI.format(mode="auto"))
    pytester.makepyfile(test_user=f"""
        import pytest

        @pytest.mark.{marker}
        def test_x(world_size):
            pass
    """)
    result = pytester.runpytest_inprocess()  # no rank process: in-process is enough
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*test_x: @pytest.mark.world_size takes one or more positive integers*"])
    assert result.parseoutcomes() == {"errors": 1}


TIMEOUT_TESTS = """
import pytest
from asyncdist.errors import DistTimeoutError


async def test_ini_option_sets_local_ranks(local_ranks):
    assert [g.timeout for g in local_ranks] == [7.0, 7.0]


@pytest.mark.asyncdist_timeout(0.5)
async def test_marker_wins_over_ini(local_ranks):
    assert [g.timeout for g in local_ranks] == [0.5, 0.5]


def sleeping_body():
    import time
    time.sleep(600)


@pytest.mark.asyncdist_timeout(2)
def test_marker_sets_spawn_ranks(spawn_ranks):
    with pytest.raises(DistTimeoutError, match=r"did not finish within 2 s"):
        spawn_ranks(sleeping_body)


@pytest.mark.asyncdist_timeout("soon")
def test_bad_marker(world_size, spawn_ranks):
    pass
"""


@pytest.mark.timeout(RUN_TIMEOUT)
def test_timeouts_per_run_and_per_test(pytester: pytest.Pytester) -> None:
    pytester.makeini(INI.format(mode="auto") + "asyncdist_timeout = 7\n")
    pytester.makepyfile(test_user=TIMEOUT_TESTS)
    result = pytester.runpytest_subprocess("-v", timeout=RUN_TIMEOUT)
    result.stdout.fnmatch_lines([
        "*test_ini_option_sets_local_ranks* PASSED*",
        "*test_marker_wins_over_ini* PASSED*",
        "*test_marker_sets_spawn_ranks PASSED*",
        "*test_bad_marker ERROR*",
        "*asyncdist_timeout must be a positive number of seconds, got 'soon'*",
    ])


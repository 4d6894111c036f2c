"""The pytest plugin of asyncdist: multi-rank tests from a marker and two fixtures.

Installed with asyncdist (entry point ``pytest11``, name ``asyncdist``), so
any project that has asyncdist installed can use it without configuration.
``-p no:asyncdist`` turns it off.

The marker:

``@pytest.mark.world_size(n, ...)``
    Run the test once per size (ids ``2ranks``, ``4ranks``, ...). It may be
    put on a function, a class or a module (``pytestmark``); the closest wins.
    A test may also ``@pytest.mark.parametrize("world_size", [...])`` itself.

The fixtures:

``world_size``
    The size this test runs with: the marker's, else 2.

``local_ranks`` (async; needs pytest-asyncio)
    The ``world_size`` world groups of :func:`~asyncdist.testing.local_world`,
    indexed by rank, all in the test's event loop over loopback sockets;
    closed after the test. Drive them with ``asyncio.gather``. In
    pytest-asyncio's strict mode, mark the test ``@pytest.mark.asyncio`` as
    for any async test. The fixture runs on the loop of
    ``asyncio_default_fixture_loop_scope`` (the function's by default), which
    must be the test's loop. ``@pytest.mark.asyncdist(virtual_time=True)``
    runs them, and the test, on :func:`~asyncdist.testing.virtual_time`
    (asyncio's own loop only): timeouts and heartbeats cost no real time.

``spawn_ranks``
    A function ``spawn_ranks(fn, *args, timeout=None, env=None)`` (None: the
    configured timeout, see below) that runs
    ``fn(*args)`` on ``world_size`` processes with
    :func:`~asyncdist.testing.spawn` and returns their results by rank. ``fn``
    must be a module-level function of an importable module (a test module
    is); inside it, ``asyncdist.init_process_group()`` needs no arguments. A
    rank's exception is re-raised in the test with the rank noted and the
    remote traceback; no process outlives the call.

Example::

    import asyncio
    import numpy as np
    import pytest
    import asyncdist as dist

    @pytest.mark.world_size(2, 4)
    async def test_all_reduce_in_loop(local_ranks, world_size):
        arrays = [np.full(3, float(g.rank)) for g in local_ranks]
        await asyncio.gather(*(g.all_reduce(a) for g, a in zip(local_ranks, arrays)))
        assert all((a == sum(range(world_size))).all() for a in arrays)

    def rank_body():
        dist.init_process_group()
        return dist.get_rank(), dist.get_world_size()

    @pytest.mark.world_size(2, 4)
    def test_ranks_as_processes(spawn_ranks, world_size):
        assert spawn_ranks(rank_body) == [(r, world_size) for r in range(world_size)]

Timeouts: ``local_ranks``' groups time out an operation after 60 s and
``spawn_ranks`` gives a job 120 s, unless configured: per run with the ini
option ``asyncdist_timeout = SECONDS`` (both), per test (class, module) with
``@pytest.mark.asyncdist_timeout(seconds)``, which wins over the ini option;
``spawn_ranks(fn, timeout=...)`` wins over both.

The plugin only adds names; it changes no other test, and it knows nothing
of pytest-asyncio's internals beyond its public ``fixture`` decorator.
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Callable

import pytest

try:
    import pytest_asyncio
except ImportError:  # local_ranks then says what is missing
    _HAVE_PYTEST_ASYNCIO = False
else:
    _HAVE_PYTEST_ASYNCIO = True

from .fault_plugin import (
    _asyncdist_fault_plan, add_fault_options, configure_faults, faults, marked_virtual_time, marked_world_size,
)
from .fault_plugin import pytest_runtest_makereport  # noqa: F401  (pytest finds the hook here)

__all__ = ["world_size", "local_ranks", "spawn_ranks", "faults", "_asyncdist_fault_plan"]

#: The world size of a test that asks for one without the marker.
DEFAULT_WORLD_SIZE = 2
_MARKER = "world_size"

#: Seconds an operation of a ``local_ranks`` group may take, unless configured.
LOCAL_RANKS_TIMEOUT = 60.0
#: Seconds a ``spawn_ranks`` job may take, unless configured.
SPAWN_TIMEOUT = 120.0
_TIMEOUT = "asyncdist_timeout"  # the marker's and the ini option's name


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        _TIMEOUT,
        "seconds for local_ranks' operations and spawn_ranks' jobs (asyncdist plugin; "
        f"default {LOCAL_RANKS_TIMEOUT:g} and {SPAWN_TIMEOUT:g})",
        default="",
    )
    add_fault_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    configure_faults(config)
    config.addinivalue_line(
        "markers",
        f"{_MARKER}(n, ...): run the test once per world size n; "
        "the fixtures world_size, local_ranks and spawn_ranks use it (asyncdist plugin)",
    )
    config.addinivalue_line(
        "markers",
        f"{_TIMEOUT}(seconds): the timeout of this test's local_ranks operations and spawn_ranks jobs "
        f"(asyncdist plugin; wins over the {_TIMEOUT} ini option)",
    )


def _positive(value: Any, where: str) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if not seconds > 0 or seconds == float("inf") or isinstance(value, bool):
        pytest.fail(f"{where}: {_TIMEOUT} must be a positive number of seconds, got {value!r}", pytrace=False)
    return seconds


def _timeout(request: pytest.FixtureRequest, default: float) -> float:
    """The test's configured timeout: its marker's, else the ini option's, else ``default``."""
    marker = request.node.get_closest_marker(_TIMEOUT)
    if marker is not None:
        if len(marker.args) != 1 or marker.kwargs:
            pytest.fail(f"{request.node.nodeid}: @pytest.mark.{_TIMEOUT} takes one number of seconds", pytrace=False)
        return _positive(marker.args[0], request.node.nodeid)
    configured = request.config.getini(_TIMEOUT)
    return _positive(configured, f"ini option {_TIMEOUT}") if configured else default


def _sizes(marker: pytest.Mark, nodeid: str) -> list[int]:
    sizes = list(marker.args)
    if not sizes or marker.kwargs or not all(type(n) is int and n >= 1 for n in sizes):
        pytest.fail(
            f"{nodeid}: @pytest.mark.{_MARKER} takes one or more positive integers, "
            f"got args={marker.args!r} kwargs={marker.kwargs!r}",
            pytrace=False,
        )
    return sizes


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker(_MARKER) or marked_world_size(metafunc.definition)
    if marker is None:
        return
    sizes = _sizes(marker, metafunc.definition.nodeid)
    if _MARKER not in metafunc.fixturenames:  # the test may reach it with request.getfixturevalue
        metafunc.fixturenames.append(_MARKER)
    metafunc.parametrize(_MARKER, sizes, ids=[f"{n}ranks" for n in sizes])


@pytest.fixture(name=_MARKER)
def world_size() -> int:
    """The world size of this test (the ``world_size`` marker's, else 2)."""
    return DEFAULT_WORLD_SIZE


if _HAVE_PYTEST_ASYNCIO:

    @pytest_asyncio.fixture
    async def local_ranks(world_size: int, request: pytest.FixtureRequest) -> AsyncIterator[list[Any]]:
        """``world_size`` ranks in the test's loop: their world ProcessGroups, by rank."""
        from .world import local_world

        async with local_world(world_size, timeout=_timeout(request, LOCAL_RANKS_TIMEOUT),
                               virtual_time=marked_virtual_time(request.node)) as ranks:
            yield ranks

else:

    @pytest.fixture
    def local_ranks(world_size: int) -> list[Any]:
        """Unavailable: async fixtures need pytest-asyncio."""
        pytest.fail("the local_ranks fixture needs pytest-asyncio: pip install pytest-asyncio", pytrace=False)


@pytest.fixture
def spawn_ranks(world_size: int, request: pytest.FixtureRequest) -> Callable[..., list[Any]]:
    """Run a module-level function on ``world_size`` rank processes; return results by rank."""
    from .spawn import spawn

    configured = _timeout(request, SPAWN_TIMEOUT)

    def run(fn: Callable[..., Any], *args: Any, timeout: float | None = None,
            env: dict[str, str] | None = None) -> list[Any]:
        return spawn(world_size, fn, *args, timeout=configured if timeout is None else timeout, env=env)

    return run

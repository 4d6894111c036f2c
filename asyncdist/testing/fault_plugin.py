"""The pytest plugin's fault plans: the ``asyncdist`` marker, the ``faults`` fixture, replay by seed.

Part of the plugin (:mod:`.plugin` imports these names, so pytest finds them there).

``@pytest.mark.asyncdist(world_size=4, faults="kill 2 at all_reduce#3")``
    Run the test under that plan (:mod:`.faults`), installed in the test's
    process from before its fixtures start ranks until after they are closed:
    ``local_ranks`` runs under it, and ``spawn_ranks``' processes install it.
    ``world_size=`` is the test's size, as ``@pytest.mark.world_size(n)``.
    ``kinds=[...]`` instead of ``faults=`` draws the plan from the test's seed
    with :meth:`FaultPlan.random <asyncdist.testing.faults.FaultPlan.random>`;
    the marker's other keywords (``ops``, ``max_count``, ``count``,
    ``max_seconds``, ``spare``) are passed to it. ``virtual_time=True`` runs
    ``local_ranks`` on :func:`~asyncdist.testing.virtual_time`, so that a
    plan's pauses and cuts, and the heartbeat timeouts they cause, cost no
    real time.

``faults`` (fixture)
    The test's plan (empty without the marker); its ``seed`` is the test's
    seed, also without the marker, for plans a test draws itself.

The test's seed is ``--asyncdist-seed=N``, else ``ASYNCDIST_SEED``, else one
derived from the test's id: the same test gets the same plan whatever ran
before it. A test that fails under a plan shows it, with the line that
replays it, in a report section "asyncdist fault plan".
"""

from __future__ import annotations

import zlib
from typing import Any, Generator, Iterator

import pytest

from .. import settings
from .faults import FaultPlan
from .injector import install, installed, uninstall

__all__ = ["add_fault_options", "configure_faults", "marked_world_size", "marked_virtual_time", "faults",
           "pytest_runtest_makereport"]

MARKER = "asyncdist"
_OPTION = "--asyncdist-seed"
_PLAN = pytest.StashKey[FaultPlan]()
_SEED = pytest.StashKey[int]()


def add_fault_options(parser: pytest.Parser) -> None:
    """The ``--asyncdist-seed`` option (from the plugin's ``pytest_addoption``)."""
    parser.addoption(_OPTION, type=int, default=None, metavar="N",
                     help="the seed of every test's fault plan (asyncdist plugin; default: ASYNCDIST_SEED, "
                          "else one per test)")  # fmt: skip


def configure_faults(config: pytest.Config) -> None:
    """Register the marker (from the plugin's ``pytest_configure``)."""
    config.addinivalue_line(
        "markers",
        f"{MARKER}(world_size=n, faults='kill 2 at all_reduce#3' or kinds=[...], virtual_time=False): run the "
        "test under a fault plan, fixed or drawn from the test's seed, and local_ranks on virtual time "
        "(asyncdist plugin)",
    )


def marked_world_size(definition: Any) -> pytest.Mark | None:
    """The ``asyncdist`` marker's ``world_size=`` as a ``world_size`` marker, or None."""
    marker = definition.get_closest_marker(MARKER)
    if marker is None or "world_size" not in marker.kwargs:
        return None
    return pytest.mark.world_size(marker.kwargs["world_size"]).mark


def marked_virtual_time(item: pytest.Item) -> bool:
    """The ``asyncdist`` marker's ``virtual_time=`` (False without it)."""
    marker = item.get_closest_marker(MARKER)
    chosen = False if marker is None else marker.kwargs.get("virtual_time", False)
    if type(chosen) is not bool:
        pytest.fail(f"{item.nodeid}: @pytest.mark.{MARKER}(virtual_time=...) takes True or False, got {chosen!r}",
                    pytrace=False)
    return chosen


def _seed(item: pytest.Item) -> int:
    chosen = item.config.getoption(_OPTION)
    if chosen is None:
        chosen = settings.current().seed
    return zlib.crc32(item.nodeid.encode()) if chosen is None else chosen


def _plan(item: pytest.Item, seed: int, world_size: int | None) -> FaultPlan:
    marker = item.get_closest_marker(MARKER)
    assert marker is not None
    if marker.args:
        pytest.fail(f"{item.nodeid}: @pytest.mark.{MARKER} takes keywords only", pytrace=False)
    options = {k: v for k, v in marker.kwargs.items() if k not in ("world_size", "faults", "kinds", "virtual_time")}
    if "kinds" in marker.kwargs:
        if "faults" in marker.kwargs or world_size is None:
            pytest.fail(f"{item.nodeid}: @pytest.mark.{MARKER}(kinds=...) needs a world size and no faults=",
                        pytrace=False)  # fmt: skip
        return FaultPlan.random(seed, world_size, marker.kwargs["kinds"], **options)
    if options:
        pytest.fail(f"{item.nodeid}: @pytest.mark.{MARKER}: {sorted(options)} only go with kinds=", pytrace=False)
    plan = FaultPlan.of(marker.kwargs.get("faults"))
    return plan if plan.seed is not None else FaultPlan(plan.faults, seed)


@pytest.fixture(autouse=True)
def _asyncdist_fault_plan(request: pytest.FixtureRequest) -> Iterator[None]:
    """Install the test's plan before any fixture starts ranks; remove it after they are closed."""
    item = request.node
    if item.get_closest_marker(MARKER) is None:  # every other test: nothing to do
        yield
        return
    seed = _seed(item)
    callspec = getattr(item, "callspec", None)  # the world_size markers parametrize it
    world_size = callspec.params.get("world_size") if callspec is not None else None
    plan = _plan(item, seed, world_size)
    item.stash[_SEED], item.stash[_PLAN] = seed, plan
    if not plan:
        yield
        return
    if installed() is not None:  # a plan another test left behind: results must not depend on order
        uninstall()
    install(plan)
    try:
        yield
    finally:
        uninstall()


@pytest.fixture
def faults(request: pytest.FixtureRequest, _asyncdist_fault_plan: None) -> FaultPlan:
    """This test's fault plan (empty without the ``asyncdist`` marker), with the test's seed."""
    item = request.node
    return item.stash[_PLAN] if _PLAN in item.stash else FaultPlan(seed=_seed(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo,
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Add the test's plan, and how to replay it, to the report of a failure under one."""
    report = yield
    plan = item.stash.get(_PLAN, None)
    if report.failed and plan:
        report.sections.append((
            "asyncdist fault plan",
            f"{plan}\nreplay: pytest '{item.nodeid}' {_OPTION}={item.stash[_SEED]}",
        ))  # fmt: skip
    return report

"""One local Ray cluster for every test of this folder (started once: ~3 s).

Every test that needs Ray skips cleanly where it is not installed
(``pip install -e ".[ray]"``).
Functions that the tests send to the actors are pickled by value, so the
actors need not import the test modules.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

try:
    import ray
except ImportError:  # each test module skips itself; test_ray_import.py runs either way
    ray = None

#: Ray warns about its own deprecated internal settings (ray.data's context, read by
#: Ray Train); those are Ray's to fix, not failures of these tests.
_RAY_DEPRECATIONS = pytest.mark.filterwarnings(r"ignore::DeprecationWarning:ray\..*")
_HERE = Path(__file__).parent

#: Logical CPUs of the test cluster: enough for a 3-rank world, or Ray Train's 2 workers.
CPUS = 4


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in item.path.parents:
            item.add_marker(_RAY_DEPRECATIONS)


@pytest.fixture(scope="package")
def ray_cluster() -> Iterator[None]:
    """A local Ray cluster for this folder's tests, shut down after the last one."""
    if ray is None:
        pytest.skip("Ray is not installed (pip install -e '.[ray]')")
    ray.init(num_cpus=CPUS, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(autouse=True)
def _ship_test_functions_by_value(request: pytest.FixtureRequest) -> None:
    """Let Ray pickle this test module's functions by value (the actors cannot import it)."""
    if ray is not None:
        ray.cloudpickle.register_pickle_by_value(request.module)

"""Fixtures of the test harness's own tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def pytester(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """pytester, for a user's own pytest run: none of pytest-xdist's worker
    variables leak into it when this suite runs under ``-n``."""
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)
    return pytester

"""Shared test configuration: every async test runs on asyncio and on uvloop."""

from __future__ import annotations

import asyncio
import os
from typing import Callable, Mapping

import pytest

try:
    import uvloop
except ImportError:  # uvloop is Linux-only
    uvloop = None


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> Mapping[str, Callable]:
    factories: dict[str, Callable] = {"asyncio": asyncio.new_event_loop}
    if uvloop is not None:
        factories["uvloop"] = uvloop.new_event_loop
    return factories


# Property tests: reproducible in CI (CI=true), exploring locally.
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

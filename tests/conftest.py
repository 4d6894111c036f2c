"""Shared test configuration: every async test runs on asyncio and on uvloop."""

from __future__ import annotations

import asyncio
import os
from typing import AsyncIterator, Callable, Mapping

import pytest
import pytest_asyncio

from asyncdist.testing import virtual_time

try:
    import uvloop
except ImportError:  # uvloop is Linux-only
    uvloop = None


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> Mapping[str, Callable]:
    factories: dict[str, Callable] = {"asyncio": asyncio.new_event_loop}
    if uvloop is not None:
        factories["uvloop"] = uvloop.new_event_loop
    return factories


@pytest_asyncio.fixture
async def virtual_clock() -> AsyncIterator[bool]:
    """The test runs on virtual time where its loop allows: timeouts, heartbeats and
    the close linger of a lost peer pass at once on asyncio's loop (yields True);
    uvloop's clock is libuv's, so its run of the same test waits them out (False)."""
    if isinstance(asyncio.get_running_loop(), asyncio.BaseEventLoop):
        with virtual_time():
            yield True
    else:
        yield False


# Property tests: reproducible in CI (CI=true), exploring locally.
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

"""Fixtures of the engine's tests: each kind of flight-recorder ring."""

from __future__ import annotations

import pytest

from asyncdist.engine.ring import NATIVE, PyRing, Ring


@pytest.fixture(params=[
    pytest.param(PyRing, id="python"),
    pytest.param(Ring, id="native", marks=pytest.mark.skipif(not NATIVE, reason="the C ring was not built")),
])
def ring_type(request: pytest.FixtureRequest) -> type:
    """The Python ring, and the C one where it was built: both must pass the same tests."""
    return request.param

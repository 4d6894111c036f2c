"""Fixtures of the engine's tests: each kind of flight-recorder ring."""

from __future__ import annotations

import pytest

from asyncdist.flight.record_ring import NATIVE, PyRecordRing, RecordRing


@pytest.fixture(params=[
    pytest.param(PyRecordRing, id="python"),
    pytest.param(RecordRing, id="native", marks=pytest.mark.skipif(not NATIVE, reason="the C ring was not built")),
])
def ring_type(request: pytest.FixtureRequest) -> type:
    """The Python ring, and the C one where it was built: both must pass the same tests."""
    return request.param

"""until_listening: the probe that both init_process_group and asyncdist-run use to wait for a store's port."""

from __future__ import annotations

import socket
import time

import pytest

from asyncdist.rendezvous.waiting import until_listening


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once it is closed


def test_returns_once_the_port_listens_and_reports_nothing():
    refusals: list[OSError] = []
    with socket.create_server(("127.0.0.1", 0)) as server:
        until_listening("127.0.0.1", server.getsockname()[1], time.monotonic() + 5, lambda now, exc: refusals.append(exc))
    assert refusals == []


def test_each_refusal_is_heard_and_the_last_is_raised_at_the_deadline():
    refusals: list[tuple[float, OSError]] = []
    start = time.monotonic()
    with pytest.raises(ConnectionRefusedError) as raised:
        until_listening("127.0.0.1", _closed_port(), start + 0.1, lambda now, exc: refusals.append((now, exc)))
    assert time.monotonic() - start >= 0.1
    assert refusals, "a refusal before the deadline is heard"
    assert all(isinstance(exc, ConnectionRefusedError) and now < start + 0.1 for now, exc in refusals)
    assert raised.value is not refusals[-1][1]  # the last probe's own refusal, after the deadline

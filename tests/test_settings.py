"""asyncdist/settings.py: each kind of variable parsed, the defaults, the error
naming a bad value, and docs/configuration.md's tables as the declarations print them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from asyncdist import settings
from asyncdist.errors import ConfigurationError, InvalidArgumentError
from asyncdist.settings import Settings

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def test_an_empty_environment_gives_every_default() -> None:
    read = Settings.from_environ({})
    assert read == Settings()
    assert (read.heartbeat_interval, read.heartbeat_timeout, read.init_report_every, read.hang_warn) == (
        5.0, 30.0, 30.0, 60.0)
    assert (read.trace_buffer, read.cma_min_bytes, read.scratch_keep_bytes, read.pinned_pool_bytes) == (
        2000, 524288, 268435456, 1073741824)
    assert (read.join, read.cma, read.shm, read.caller_runs_loop) == (False, True, True, True)
    assert (read.secret, read.loop, read.spin, read.shm_ring_bytes, dict(read.environ)) == (None, None, None, None, {})


@pytest.mark.parametrize(("name", "text", "field", "expected"), [
    ("ASYNCDIST_SECRET", " s3cret ", "secret", " s3cret "),  # text is kept as given
    ("ASYNCDIST_HEARTBEAT_INTERVAL", " 0.5 ", "heartbeat_interval", 0.5),
    ("ASYNCDIST_HANG_WARN", "0", "hang_warn", 0.0),
    ("ASYNCDIST_INIT_REPORT_EVERY", "inf", "init_report_every", float("inf")),
    ("ASYNCDIST_TRACE_BUFFER", "17", "trace_buffer", 17),
    ("ASYNCDIST_SPIN_US", "250", "spin", 250e-6),
    ("ASYNCDIST_SPIN_US", "-5", "spin", 0.0),
    ("ASYNCDIST_CMA_MIN_BYTES", "4096", "cma_min_bytes", 4096),
    ("ASYNCDIST_SHM_RING_BYTES", "8192", "shm_ring_bytes", 8192),
    ("ASYNCDIST_CMA", "off", "cma", False),
    ("ASYNCDIST_SHM", "1", "shm", True),
    ("ASYNCDIST_JOIN", "True", "join", True),
    ("ASYNCDIST_JOIN", "0", "join", False),
    ("ASYNCDIST_LOOP", "UVLOOP", "loop", "uvloop"),
    ("ASYNCDIST_TRACE_BUFFER", "  ", "trace_buffer", 2000),  # blank: the default
])
def test_each_kind_of_variable_is_parsed(name: str, text: str, field: str, expected: object) -> None:
    read = Settings.from_environ({name: text})
    assert getattr(read, field) == expected
    assert read.environ == {name: text}


@pytest.mark.parametrize(("name", "text", "expected"), [
    ("ASYNCDIST_HEARTBEAT_TIMEOUT", "soon", "a number of seconds"),
    ("ASYNCDIST_HANG_WARN", "-1", "a number of seconds >= 0"),
    ("ASYNCDIST_TRACE_BUFFER", "1.5", "a whole number of operations >= 0"),
    ("ASYNCDIST_SPIN_US", "fast", "a number of microseconds"),
    ("ASYNCDIST_SCRATCH_KEEP_BYTES", "1G", "a number of bytes"),
    ("ASYNCDIST_SHM_RING_BYTES", "5000", "a power of two of at least 4096 bytes"),
    ("ASYNCDIST_LOOP", "trio", "'asyncio' or 'uvloop'"),
])
def test_a_bad_value_is_refused_naming_variable_value_and_expectation(name: str, text: str, expected: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        Settings.from_environ({name: text})
    assert str(info.value) == f"{name} must be {expected}, got {text!r}"
    assert isinstance(info.value, InvalidArgumentError) and isinstance(info.value, ValueError)


def test_the_launchers_variables_are_kept_as_text_and_others_left_out() -> None:
    read = Settings.from_environ({"SLURM_TASKS_PER_NODE": "4(x2),3", "RANK": "2", "HOME": "/root"})
    assert dict(read.environ) == {"SLURM_TASKS_PER_NODE": "4(x2),3", "RANK": "2"}


def test_refresh_reads_the_environment_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCDIST_HANG_WARN", "7")
    assert settings.refresh().hang_warn == 7.0 and settings.current().hang_warn == 7.0
    monkeypatch.setenv("ASYNCDIST_HANG_WARN", "never")
    with pytest.raises(ConfigurationError, match="ASYNCDIST_HANG_WARN"):
        settings.refresh()
    assert settings.current().hang_warn == 7.0  # a bad read leaves the last good one
    monkeypatch.delenv("ASYNCDIST_HANG_WARN")
    assert settings.refresh().hang_warn == 60.0


def test_every_name_is_declared_once() -> None:
    names = [v.name for v in settings.VARIABLES] + [n for f in settings.LAUNCHER_VARIABLES for n in f.names]
    assert len(names) == len(set(names)) == 47
    assert settings.name_of("spin") == "ASYNCDIST_SPIN_US"


def test_the_configuration_page_shows_the_declarations() -> None:
    printed = subprocess.run([sys.executable, "-m", "asyncdist.configuration"], capture_output=True,
                             text=True, check=True, cwd=PAGE.parents[1]).stdout
    assert printed == settings.markdown()
    assert printed in PAGE.read_text(), "docs/configuration.md differs: paste `python -m asyncdist.configuration`"

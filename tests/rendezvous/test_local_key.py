"""This user's store key: private, made once, and not blocked by another user's directory."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest

from asyncdist.errors import RendezvousError
from asyncdist.rendezvous.local_key import local_key, local_key_path

OTHER_UID = 65534  # nobody


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary directory and a home of this test's own."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


def _private(path: str, mode: int) -> bool:
    st = os.lstat(path)
    return st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == mode


def test_the_key_is_made_once_and_kept_private(host: Path) -> None:
    path = local_key_path()
    assert path == str(host / "tmp" / f"asyncdist-{os.getuid()}" / "store.key")
    first = local_key()
    assert len(first) == 64 and int(first, 16) >= 0
    assert local_key() == first == Path(path).read_bytes()
    assert _private(path, 0o600) and _private(os.path.dirname(path), 0o700)


@pytest.mark.skipif(os.getuid() != 0, reason="making a directory another user owns needs root")
def test_another_users_directory_does_not_block_the_key(host: Path, caplog: pytest.LogCaptureFixture) -> None:
    squatted = host / "tmp" / f"asyncdist-{os.getuid()}"
    squatted.mkdir(mode=0o700)
    os.chown(squatted, OTHER_UID, OTHER_UID)
    key = local_key()
    path = local_key_path()
    assert path == str(host / "home" / ".cache" / "asyncdist" / "store.key")
    assert Path(path).read_bytes() == key == local_key()
    assert _private(path, 0o600) and _private(os.path.dirname(path), 0o700)
    assert list(squatted.iterdir()) == []  # nothing of ours went into it
    assert f"belongs to uid {OTHER_UID}, not to this user" in caplog.text


def test_a_key_directory_of_ours_that_others_can_read_is_refused(host: Path) -> None:
    mine = host / "tmp" / f"asyncdist-{os.getuid()}"
    mine.mkdir(mode=0o755)
    os.chmod(mine, 0o755)
    with pytest.raises(RendezvousError, match=r"refusing the key directory .* mode 755\); remove it"):
        local_key()


def test_a_link_in_place_of_the_directory_is_refused(host: Path) -> None:
    (host / "elsewhere").mkdir(mode=0o700)
    os.symlink(host / "elsewhere", host / "tmp" / f"asyncdist-{os.getuid()}")
    with pytest.raises(RendezvousError, match="it is not a directory \\(a link\\?\\)"):
        local_key()
    assert local_key_path().startswith(str(host / "tmp"))  # ours: refused, not moved around

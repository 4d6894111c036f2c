"""This user's store key on this host: the default secret of a job that has none.

A job started by hand without ``ASYNCDIST_SECRET`` (the README's ``env://``
script, ``MASTER_ADDR=127.0.0.1``) used to serve an unauthenticated store, in
which rank 0 then published the job's secret for every local process to read.
When the store listens on loopback only, every rank of such a job runs on this
host, and almost always as one user: so the ranks authenticate with a key that
only this user can read, kept in a private directory of the host's temporary
directory (``/tmp/asyncdist-<uid>/store.key``, mode 0600 in a 0700 directory).
Another user's process can reach the port but cannot read the key, so it is
refused before it can read or write a single store key; the job's own secret
then travels through an authenticated store. Another user who makes that
directory first cannot block such jobs: every rank then finds it held by
someone else and keeps the key in this user's cache directory instead
(``~/.cache/asyncdist/store.key``), with the same checks.

This module owns the key's file and its checks. It must not know stores or
sockets. It is not used for a store that listens beyond loopback (other hosts
do not share the file); :mod:`.init_method` warns about those.

Invariants: the directory and the file are used only when they are this
user's, not links, and not readable by anyone else; the key is created once,
atomically (written to a private temporary file, then linked into place), so
ranks that start together all read the same key.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
import tempfile

from ..errors import RendezvousError

__all__ = ["local_key", "local_key_path"]

log = logging.getLogger("asyncdist.rendezvous")

_KEY_NAME = "store.key"
_CACHE_DIR = "~/.cache/asyncdist"  # where the key goes when another user holds the shared name


def _shared_dir() -> str:
    return os.path.join(tempfile.gettempdir(), f"asyncdist-{os.getuid()}")


def _owner(path: str) -> int:
    try:
        return os.lstat(path).st_uid
    except FileNotFoundError:
        return os.getuid()


def local_key_path() -> str:
    """Where this user's key lives on this host (the file may not exist yet): in the
    host's temporary directory, unless another user holds the directory's name there;
    then in this user's cache directory."""
    shared = _shared_dir()
    if _owner(shared) == os.getuid():
        return os.path.join(shared, _KEY_NAME)
    return os.path.join(os.path.expanduser(_CACHE_DIR), _KEY_NAME)


def _check_private(path: str, st: os.stat_result, kind: str) -> None:
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise RendezvousError(
            f"refusing the {kind} {path}: it must belong to this user (uid {os.getuid()}) and be private "
            f"(owner {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}); remove it, or export ASYNCDIST_SECRET "
            "on every rank")


def _private_dir(directory: str) -> None:
    os.makedirs(os.path.dirname(directory), exist_ok=True)
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode):
        raise RendezvousError(f"refusing the key directory {directory}: it is not a directory (a link?); "
                              "remove it, or export ASYNCDIST_SECRET on every rank")
    _check_private(directory, st, "key directory")


def _read(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        _check_private(path, os.fstat(fd), "key file")
        key = f.read().strip()
    return key or None


def local_key() -> bytes:
    """This user's key on this host, made on first use (blocking: file I/O).

    Returns:
        The key (64 hex digits, as bytes).

    Raises:
        RendezvousError: the key's directory or file exists but is not this
            user's private one, or cannot be made.
    """
    path = local_key_path()
    directory = os.path.dirname(path)
    if directory != _shared_dir():
        log.warning("%s belongs to uid %d, not to this user: this user's store key is kept in %s instead",
                    _shared_dir(), _owner(_shared_dir()), directory)
    try:
        _private_dir(directory)
        key = _read(path)
        if key is not None:
            return key
        fd, temp = tempfile.mkstemp(dir=directory, prefix=".key-")  # mode 0600
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_hex(32).encode())
            try:
                os.link(temp, path)  # atomic; fails if another rank made it first
            except FileExistsError:
                pass
        finally:
            os.unlink(temp)
        key = _read(path)
    except OSError as exc:
        raise RendezvousError(f"cannot use this user's store key {path}: {exc}; export ASYNCDIST_SECRET "
                              "on every rank instead") from exc
    if key is None:
        raise RendezvousError(f"this user's store key {path} is empty: remove it")
    return key

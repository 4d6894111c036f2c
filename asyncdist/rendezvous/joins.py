"""Joining a running job, through its store: the waiting room and the verdicts.

A process that joins a running world (``init_world(..., join=True)``) does not
know its rank yet: it *registers* in the store and waits there until the
world's members call ``grow()``. The keys, under the job's prefix beside
those of :mod:`asyncdist.group.bootstrap`:

* ``join/slot/<i>`` (i = 1, 2, ...): one waiting process's
  :class:`Registration`; a joiner takes the first free slot with
  compare-and-set, so two joiners at once take two slots and none is lost;
* ``join/slot/<i>/claimed``: taken (compare-and-set) by the member that leads
  the grow that admits or refuses slot i, so that no two grows take one process;
* ``join/token/<token>``: the first slot claimed with that registration
  token (compare-and-set): a registration copied into another slot (by a
  process with write access to the store) is refused there, so one process
  is never admitted twice;
* ``join/next``: where the next grow starts looking (written by the leader of
  a grow, so that the next leader, whichever rank it is, skips the slots
  examined before);
* ``join/slot/<i>/verdict``: the grow's answer to that slot, JSON: either
  ``{"admitted": {...}}`` (the new group, see
  :mod:`asyncdist.group.growth`) or ``{"refused": "<why>"}``;
* ``join/closed``: set (to the reason) once no grow will come, because the
  job's ranks have all ended (:func:`close`: ``asyncdist-run`` sets it when
  only replacements waiting to join are left); a process waiting to join
  (for the job's ranks, or for its verdict), or arriving later, raises
  :class:`~asyncdist.errors.JoinClosedError` instead of waiting out its timeout.

A registration carries a *proof*: HMAC-SHA256 of the job secret over its
token, job id and address. The leader of a grow checks it before admitting
anyone, so a process started with another secret is refused in the store,
with a message that says so, instead of failing the members' handshakes
later. (The handshake still authenticates every connection; the proof only
turns a wrong secret into a clear refusal.)

This module knows keys and JSON, not engines or groups. Loop thread (the
store's async methods).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from ..errors import JoinClosedError, RendezvousError, StoreTimeoutError
from .store import Store

__all__ = ["Registration", "register", "wait_open", "wait_verdict", "claim", "answer", "answer_once", "close", "JOIN_POLL_SECONDS"]

_SLOT = "join/slot/{}"
_VERDICT = "join/slot/{}/verdict"
_CLAIM = "join/slot/{}/claimed"
_TOKEN = "join/token/{}"
_NEXT = "join/next"
_CLOSED = "join/closed"  # set once the waiting room is closed: no grow will come (close())
#: How often a grow that must wait for joiners (``min_joiners``) looks for a
#: new registration: a store wait of this length, not a sleep.
JOIN_POLL_SECONDS = 0.2
#: How long a joiner waits for its verdict before it looks whether the waiting
#: room was closed: how late, at most, it learns that the job ended.
_CLOSED_POLL_SECONDS = 1.0


def _proof(secret: bytes, job_id: str, token: str, host: str, port: int) -> str:
    return hmac.new(secret, f"join|{job_id}|{token}|{host}:{port}".encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True, slots=True)
class Registration:
    """A process waiting to join.

    Attributes:
        token: a fresh id, telling two waiting processes apart.
        host, port: where it listens for the members' connections.
        who: ``pid N on host``, for messages.
        proof: see the module docstring.
    """

    token: str
    host: str
    port: int
    who: str
    proof: str

    @classmethod
    def make(cls, secret: bytes, job_id: str, host: str, port: int, who: str) -> Registration:
        """A new registration, its proof made with ``secret``."""
        token = uuid.uuid4().hex
        return cls(token, host, port, who, _proof(secret, job_id, token, host, port))

    def proven(self, secret: bytes, job_id: str) -> bool:
        """Whether it was made with this job's ``secret``."""
        return hmac.compare_digest(self.proof, _proof(secret, job_id, self.token, self.host, self.port))

    def encode(self) -> str:
        return json.dumps([self.token, self.host, self.port, self.who, self.proof])

    @classmethod
    def decode(cls, text: bytes) -> Registration:
        token, host, port, who, proof = json.loads(text)
        return cls(str(token), str(host), int(port), str(who), str(proof))


async def register(store: Store, registration: Registration) -> int:
    """Take the first free slot of the waiting room; return its number."""
    mine = registration.encode()
    slot = int((await store.async_compare_set(_NEXT, "", "1")).decode())
    while True:
        taken = (await store.async_compare_set(_SLOT.format(slot), "", mine)).decode()
        if taken == mine:
            return slot
        slot += 1


async def wait_open(store: Store, key: str, deadline: float, what: str) -> bool:
    """Wait until ``key`` is set (True) or ``deadline`` (time.monotonic)
    passes (False), looking at least every second whether the waiting room
    was closed: a joiner's every wait.

    Raises:
        JoinClosedError: the waiting room was closed first (the job ended:
            no grow will come); ``what`` names the process in the message.
    """
    while True:
        if await store.async_check([key]):
            return True
        if await store.async_check([_CLOSED]):
            why = (await store.async_get(_CLOSED)).decode()
            raise JoinClosedError(f"{what} was never admitted: the running job ended before a grow() took it "
                                  f"in ({why})")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        try:
            await store.async_wait([key], min(remaining, _CLOSED_POLL_SECONDS))
        except StoreTimeoutError:
            pass


async def wait_verdict(store: Store, slot: int, deadline: float, what: str) -> dict[str, Any]:
    """Wait for the verdict on ``slot`` until ``deadline`` (time.monotonic),
    or until the waiting room is closed (:func:`close`).

    Raises:
        JoinClosedError: the waiting room was closed before a verdict came.
        RendezvousError: no grow admitted or refused it in time (``what``
            names this process in the message).
    """
    key = _VERDICT.format(slot)
    if not await wait_open(store, key, deadline, what):
        raise RendezvousError(f"{what}: no member of the running job called grow() before the timeout; "
                              "the process gave up waiting to join")
    verdict: dict[str, Any] = json.loads(await store.async_get(key))
    return verdict


async def claim(store: Store, at_least: int, deadline: float) -> list[tuple[int, Registration]]:
    """Claim the registrations no grow has claimed yet, oldest first, waiting
    until there are ``at_least`` of them (or ``deadline``, time.monotonic,
    passes). Each slot is claimed with compare-and-set, so two grows at once
    (of two groups) never admit one process twice; a copy of a registration
    that a slot before it holds is refused, not returned.

    Raises:
        RendezvousError: fewer than ``at_least`` by the deadline (what was
            claimed is released, for the next grow).
    """
    token = uuid.uuid4().hex
    slot = int((await store.async_compare_set(_NEXT, "", "1")).decode())
    found: list[tuple[int, Registration]] = []
    while True:
        key = _SLOT.format(slot)
        if await store.async_check([key]):
            if (await store.async_compare_set(_CLAIM.format(slot), "", token)).decode() == token:
                registration = Registration.decode(await store.async_get(key))
                first = (await store.async_compare_set(_TOKEN.format(registration.token), "", str(slot))).decode()
                if first == str(slot):
                    found.append((slot, registration))
                else:
                    await answer(store, {slot: {"refused": f"a copy of the registration in slot {first} "
                                                           "(a process is admitted once)"}})
            slot += 1
            continue
        if len(found) >= at_least:
            break
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            for taken, _ in found:
                await store.async_delete_key(_CLAIM.format(taken))
            raise RendezvousError(f"grow: waited for {at_least} process(es) to join, {len(found)} came in time")
        try:
            await store.async_wait([key], min(remaining, JOIN_POLL_SECONDS))
        except StoreTimeoutError:
            pass
    await store.async_set(_NEXT, str(slot))  # where the next grow starts looking (claims decide)
    return found


def close(store: Store, reason: str) -> None:
    """Close the waiting room: every process waiting to join, and every one
    that registers later, raises :class:`~asyncdist.errors.JoinClosedError`
    saying ``reason``, within about a second (blocking; any thread).

    For whoever knows that the job's ranks have all ended (``asyncdist-run``:
    only replacements waiting to join are left), so that no grow will come.
    """
    store.set(_CLOSED, reason)


async def answer(store: Store, verdicts: dict[int, dict[str, Any]]) -> None:
    """Write each claimed slot's verdict (JSON)."""
    for slot, verdict in verdicts.items():
        await store.async_set(_VERDICT.format(slot), json.dumps(verdict))


async def answer_once(store: Store, slot: int, verdict: dict[str, Any]) -> None:
    """Write the verdict of ``slot`` unless it has one (compare-and-set)."""
    await store.async_compare_set(_VERDICT.format(slot), "", json.dumps(verdict))

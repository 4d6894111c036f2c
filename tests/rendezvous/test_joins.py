"""The waiting room of joining processes in the store (asyncdist.rendezvous.joins).

Registrations take distinct slots even when made at once; a registration's
proof checks with the secret it was made with and no other; two grows that
claim at once never take one registration twice, nor one grow a registration
copied into a second slot; a claim that runs out of
time releases what it took, so that the next grow admits it; a closed
waiting room fails the processes waiting in it (for their verdict, or for
the job's ranks), but not one already answered.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from asyncdist.errors import JoinClosedError, RendezvousError
from asyncdist.rendezvous import joins
from asyncdist.rendezvous.hash_store import HashStore


def _registration(n: int, secret: bytes = b"s3cret") -> joins.Registration:
    return joins.Registration.make(secret, "job-1", "127.0.0.1", 40000 + n, f"pid {n} on here")


def test_a_proof_checks_with_its_own_secret_only() -> None:
    made = _registration(1)
    assert made.proven(b"s3cret", "job-1")
    assert not made.proven(b"other", "job-1")
    assert not made.proven(b"s3cret", "job-2")
    assert joins.Registration.decode(made.encode().encode()) == made


async def test_registrations_at_once_take_distinct_slots_and_claims_at_once_split_them() -> None:
    store = HashStore()
    made = [_registration(n) for n in range(6)]
    slots = await asyncio.gather(*(joins.register(store, r) for r in made))
    assert sorted(slots) == [1, 2, 3, 4, 5, 6]
    deadline = time.monotonic() + 5
    first, second = await asyncio.gather(joins.claim(store, 0, deadline), joins.claim(store, 0, deadline))
    claimed = [r for _, r in first + second]
    assert sorted(claimed, key=lambda r: r.port) == made  # each exactly once
    assert await joins.claim(store, 0, deadline) == []  # nothing left for a later grow


async def test_a_registration_copied_into_another_slot_is_admitted_once() -> None:
    store = HashStore()
    original = _registration(1)
    assert await joins.register(store, original) == 1
    store.set("join/slot/2", original.encode())  # a process with write access copies it
    other = _registration(3)
    assert await joins.register(store, other) == 3
    claimed = await joins.claim(store, 0, time.monotonic() + 5)
    assert [(slot, r) for slot, r in claimed] == [(1, original), (3, other)]
    refused = await joins.wait_verdict(store, 2, time.monotonic() + 5, "the copy")
    assert refused == {"refused": "a copy of the registration in slot 1 (a process is admitted once)"}
    store.set("join/slot/4", original.encode())  # copied again, for a later grow
    assert await joins.claim(store, 0, time.monotonic() + 5) == []
    assert "slot 1" in (await joins.wait_verdict(store, 4, time.monotonic() + 5, "the copy"))["refused"]


async def test_a_claim_that_runs_out_of_time_releases_what_it_took() -> None:
    store = HashStore()
    await joins.register(store, _registration(1))
    with pytest.raises(RendezvousError, match=r"grow: waited for 2 process\(es\) to join, 1 came in time"):
        await joins.claim(store, 2, time.monotonic() + 0.3)
    (slot, again), = await joins.claim(store, 1, time.monotonic() + 5)
    assert (slot, again.port) == (1, 40001)


async def test_a_closed_waiting_room_fails_its_waiters_at_once_but_not_an_answered_one() -> None:
    store = HashStore()
    waiting = await joins.register(store, _registration(1))
    answered = await joins.register(store, _registration(2))
    await joins.answer(store, {answered: {"admitted": {"id": 7}}})
    deadline = time.monotonic() + 60
    waiter = asyncio.ensure_future(joins.wait_verdict(store, waiting, deadline, "joining process (pid 1 on here)"))
    asyncio.get_running_loop().call_soon(joins.close, store, "every rank of the job has exited")
    with pytest.raises(JoinClosedError, match=r"^joining process \(pid 1 on here\) was never admitted: the running "
                                              r"job ended before a grow\(\) took it in \(every rank of the job has "
                                              r"exited\)$"):
        await asyncio.wait_for(waiter, 10)  # within a poll (1 s), not the minute left to its deadline
    assert await joins.wait_verdict(store, answered, deadline, "joining process (pid 2 on here)") == \
        {"admitted": {"id": 7}}
    later = await joins.register(store, _registration(3))  # arrives after the close
    with pytest.raises(JoinClosedError, match=r"^joining process \(pid 3 on here\) was never admitted"):
        await asyncio.wait_for(joins.wait_verdict(store, later, deadline, "joining process (pid 3 on here)"), 10)
    with pytest.raises(JoinClosedError, match=r"^joining process \(pid 4 on here\) was never admitted"):
        await asyncio.wait_for(joins.wait_open(store, "joined", deadline, "joining process (pid 4 on here)"), 10)
    store.set("joined", "2")
    assert await joins.wait_open(store, "joined", deadline, "joining process (pid 4 on here)")  # set: no wait

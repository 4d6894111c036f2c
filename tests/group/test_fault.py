"""Tests for asyncdist.group.fault and .agreement: revoke, agree, shrink, failed_ranks.

Real ranks over real sockets in one loop; a rank dies as under SIGKILL through
:func:`asyncdist.testing.crash`. The values are checked against what the
flags and the dead ranks give by hand (``functools.reduce`` for the AND).
"""

from __future__ import annotations

import asyncio
import functools
import operator

import numpy as np
import pytest

from asyncdist.errors import (
    GroupRevokedError, InvalidArgumentError, OperationTimeoutError, PeerLostError, RankExcludedError,
)
from asyncdist.group.agreement import DECIDE
from asyncdist.group.process_group import ProcessGroup
from asyncdist.testing import crash, local_world


def _and(flags: list[int]) -> int:
    return functools.reduce(operator.and_, flags)


async def _close(groups: list[ProcessGroup]) -> None:
    await asyncio.gather(*(g.close() for g in groups))


async def test_agree_is_the_and_of_every_flag_and_sees_no_failure() -> None:
    flags = [0b1111, 0b1101, 0b0111, 0b1110]
    async with local_world(4) as ranks:
        assert await asyncio.gather(*(g.agree(f) for g, f in zip(ranks, flags))) == [_and(flags)] * 4
        assert [g.failed_ranks() for g in ranks] == [[]] * 4
        # and again: instances are numbered, one after the other
        assert await asyncio.gather(*(g.agree(-1) for g in ranks)) == [-1] * 4


async def test_agree_after_a_death_leaves_the_dead_flag_out_and_names_it() -> None:
    flags = [0b011, 0b110, 0b000, 0b111]  # rank 2's zero must not count: it is dead
    async with local_world(4) as ranks:
        crash(ranks[2])
        live = [0, 1, 3]
        got = await asyncio.gather(*(ranks[r].agree(flags[r]) for r in live))
        assert got == [_and([flags[r] for r in live])] * 3 == [0b010] * 3
        assert [ranks[r].failed_ranks() for r in live] == [[2]] * 3
        await ranks[2].engine.close()


async def test_a_coordinator_dying_mid_broadcast_cannot_split_the_decision() -> None:
    # Rank 0 coordinates; it tells only rank 3 its decision, then dies. Rank 1,
    # the next coordinator, must learn that decision (from rank 3) and hand it
    # on, not decide anew without rank 0's flag.
    flags = [0b0110, 0b1111, 0b1111, 0b1111]
    async with local_world(4, timeout=10) as ranks:
        coordinator = ranks[0].faults.agreement
        send = coordinator._send

        def partial_broadcast(rank: int, k: int, step: int, body: str) -> None:
            if step != DECIDE:
                send(rank, k, step, body)
            elif rank == 3:
                send(rank, k, step, body)
                crash(ranks[0])

        coordinator._send = partial_broadcast  # type: ignore[method-assign]
        dead = asyncio.ensure_future(ranks[0].agree(flags[0]))
        got = await asyncio.gather(*(ranks[r].agree(flags[r]) for r in (1, 2, 3)))
        assert got == [_and(flags)] * 3 == [0b0110] * 3
        # Rank 3 may return before it notices rank 0's death (the decision did
        # not count it); once it does (here: a send to it fails), every survivor names it.
        with pytest.raises(PeerLostError):
            await ranks[3].send(np.zeros(1), dst=0)
        assert [ranks[r].failed_ranks() for r in (1, 2, 3)] == [[0]] * 3
        await asyncio.gather(dead, return_exceptions=True)
        await ranks[0].engine.close()


async def test_revoke_fails_ranks_blocked_in_other_operations_then_agree_and_shrink_work() -> None:
    async with local_world(3, timeout=10) as ranks:
        got = np.zeros(2)
        blocked = [
            asyncio.ensure_future(ranks[0].recv(got, src=2, tag=5)),  # rank 2 never sends
            asyncio.ensure_future(ranks[1].all_reduce(np.ones(4))),  # the others never join
        ]
        await asyncio.sleep(0.05)  # both are waiting (nothing else could wake them)
        assert not any(task.done() for task in blocked)
        await ranks[2].revoke()
        for task in blocked:
            with pytest.raises(GroupRevokedError, match="was revoked by rank 2"):
                await task
        for g in ranks:  # later operations fail too, at once
            with pytest.raises(GroupRevokedError):
                await g.barrier()
        with pytest.raises(GroupRevokedError):
            await ranks[0].send(np.ones(1), dst=1)
        assert await asyncio.gather(*(g.agree(1) for g in ranks)) == [1, 1, 1]
        shrunk = await asyncio.gather(*(g.shrink() for g in ranks))
        values = [np.full(3, float(r)) for r in range(3)]
        await asyncio.gather(*(g.all_reduce(v) for g, v in zip(shrunk, values)))
        assert [v.tolist() for v in values] == [[3.0] * 3] * 3
        await _close(shrunk)


async def test_two_revokes_at_once_are_one_and_reach_a_blocked_rank() -> None:
    async with local_world(3, timeout=10) as ranks:
        waiting = asyncio.ensure_future(ranks[1].recv(np.zeros(1), src=0))
        await asyncio.gather(ranks[0].revoke(), ranks[2].revoke())
        with pytest.raises(GroupRevokedError):
            await waiting
        assert all(g.faults.revoked is not None for g in ranks)
        assert await asyncio.gather(*(g.agree(7) for g in ranks)) == [7, 7, 7]


async def test_a_revoke_reaches_everyone_when_its_initiator_dies_midway() -> None:
    # Rank 0 tells only rank 1 and dies: rank 1 forwards it, so rank 2, blocked
    # on a receive from rank 1 (alive), is freed by the revoke, not a timeout.
    async with local_world(3, timeout=10) as ranks:
        faults = ranks[0].engine.faults
        send = faults.send
        faults.send = lambda rank, header: send(rank, header) if rank == 1 else False  # type: ignore[method-assign]
        waiting = asyncio.ensure_future(ranks[2].recv(np.zeros(1), src=1))
        await ranks[0].revoke()
        crash(ranks[0])
        with pytest.raises(GroupRevokedError, match="was revoked by rank 0"):
            await asyncio.wait_for(waiting, 10)
        assert ranks[1].faults.revoked is not None
        await ranks[0].engine.close()


async def test_shrink_renumbers_the_survivors_in_the_old_order() -> None:
    async with local_world(5) as ranks:
        crash(ranks[1])
        crash(ranks[3])
        live = [ranks[r] for r in (0, 2, 4)]
        shrunk = await asyncio.gather(*(g.shrink() for g in live))
        assert [(s.ranks, s.rank, s.size) for s in shrunk] == [((0, 2, 4), i, 3) for i in range(3)]
        assert [s.failed_ranks() for s in shrunk] == [[]] * 3
        out = [np.empty(3) for _ in shrunk]
        await asyncio.gather(*(s.all_gather_into_tensor(o, np.array([float(s.rank)])) for s, o in zip(shrunk, out)))
        assert [o.tolist() for o in out] == [[0.0, 1.0, 2.0]] * 3
        # the survivors can still make groups, all of them in step
        pairs = [s.new_group([2, 0]) for s in shrunk]
        sums = [np.array([float(r)]) for r in (0, 2, 4)]
        await asyncio.gather(*(p.all_reduce(v) for p, v in zip(pairs, sums) if p.rank >= 0))
        assert [sums[0][0], sums[2][0]] == [4.0, 4.0]
        await _close(shrunk)
        await asyncio.gather(ranks[1].engine.close(), ranks[3].engine.close())


async def test_shrink_of_a_subgroup_leaves_the_other_ranks_in_step() -> None:
    async with local_world(4) as ranks:
        subs = [w.new_group([3, 1, 2]) for w in ranks]  # group ranks: 3 -> 0, 1 -> 1, 2 -> 2
        crash(ranks[1])
        shrunk = await asyncio.gather(subs[3].shrink(), subs[2].shrink())
        assert [(s.ranks, s.rank) for s in shrunk] == [((3, 2), 0), ((3, 2), 1)]
        values = [np.array([10.0]), np.array([1.0])]
        await asyncio.gather(*(s.all_reduce(v) for s, v in zip(shrunk, values)))
        assert [v[0] for v in values] == [11.0, 11.0]
        # rank 0 made no shrunk group, yet every live rank's next group matches
        trios = [ranks[r].new_group([0, 2, 3]) for r in (0, 2, 3)]
        ones = [np.ones(1) for _ in trios]
        await asyncio.gather(*(t.all_reduce(v) for t, v in zip(trios, ones)))
        assert [v[0] for v in ones] == [3.0] * 3
        await ranks[1].engine.close()


async def test_a_rank_others_count_as_failed_is_excluded_cleanly() -> None:
    # A false suspicion: rank 0 drops rank 2 (as a heartbeat timeout would),
    # rank 1 still hears from it. The agreement makes it a clean exclusion.
    async with local_world(3) as ranks:
        ranks[0].engine.faults.expel(2, "a test says so")
        with pytest.raises(RankExcludedError, match="rank 2 was excluded from the job by rank 0: a test says so"):
            await ranks[2].agree(1)
        assert await asyncio.gather(ranks[0].agree(1), ranks[1].agree(1)) == [1, 1]
        assert [ranks[0].failed_ranks(), ranks[1].failed_ranks()] == [[2], [2]]
        shrunk = await asyncio.gather(ranks[0].shrink(), ranks[1].shrink())
        assert [s.ranks for s in shrunk] == [(0, 1), (0, 1)]
        with pytest.raises(RankExcludedError):
            await ranks[2].barrier()
        await _close(shrunk)


async def test_shrink_can_exclude_a_live_rank_which_must_not_take_part() -> None:
    async with local_world(3) as ranks:
        with pytest.raises(InvalidArgumentError, match="is among the ranks to exclude and must not take part"):
            await ranks[1].shrink(exclude=[1])
        shrunk = await asyncio.gather(ranks[0].shrink(exclude=[1]), ranks[2].shrink(exclude=[1]))
        assert [s.ranks for s in shrunk] == [(0, 2), (0, 2)]
        with pytest.raises(RankExcludedError):
            await ranks[1].agree(1)
        await _close(shrunk)


async def test_agree_refuses_a_flag_that_is_not_an_int() -> None:
    async with local_world(2) as ranks:
        with pytest.raises(InvalidArgumentError, match="flag must be an int, got 1.5"):
            await ranks[0].agree(1.5)  # type: ignore[arg-type]


async def test_an_agreement_that_cannot_finish_says_whom_it_waits_for() -> None:
    async with local_world(2) as ranks:
        with pytest.raises(OperationTimeoutError, match=r"rank 0: agree\(1\) \(agreement #0 of group 'local2'\) did "
                           r"not complete within 0.2 s; waiting for the state of rank 1"):
            await ranks[0].agree(1, timeout=0.2)
        with pytest.raises(OperationTimeoutError, match="waiting for the decision of rank 0"):
            await ranks[1].shrink(timeout=0.2)


async def test_two_agreements_at_once_on_one_rank_are_refused() -> None:
    async with local_world(2) as ranks:
        first = asyncio.ensure_future(ranks[0].agree(1))
        await asyncio.sleep(0)  # the first is under way
        with pytest.raises(InvalidArgumentError, match="while agreement #0 is under way"):
            await ranks[0].agree(1)
        assert await asyncio.gather(first, ranks[1].agree(3)) == [1, 1]


async def test_a_reset_that_comes_with_a_dead_ranks_last_frames_is_seen_at_once() -> None:
    # The last frame and the reset arrive together; on uvloop the loop reports
    # that socket's readiness once (see asyncdist.transport.stream).
    async with local_world(2) as ranks:
        ranks[1].isend(np.ones(1), dst=0)
        crash(ranks[1])
        with pytest.raises(PeerLostError, match="rank 1"):
            await asyncio.wait_for(ranks[0].recv(np.zeros(1), src=1, tag=5), 3)
        await ranks[1].engine.close()

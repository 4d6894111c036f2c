"""Tests for asyncdist.engine.progress: what an operation in flight awaits, and the
words of its timeout.

The pure parts (``Awaited``, ``timeout_message``, ``Progress``,
``register``/``context_for``) are fed hand-made steps and futures, without a
world; the expected messages are written out in full. The last tests check
the same words come out of real operations on a local world: a ``Work.wait``
that gives up on a stuck collective call and on a receive, and a group's own
deadline. The ranks are held back by events, never by sleeps.
"""

from __future__ import annotations

import asyncio
import contextvars

import numpy as np
import pytest

from asyncdist.buffers.host import as_host_buffer
from asyncdist.engine.progress import (
    WAIT_TIMEOUT,
    Awaited,
    Progress,
    context_for,
    register,
    timeout_message,
)
from asyncdist.errors import OperationTimeoutError
from asyncdist.group.work import Work
from asyncdist.testing import local_world

NOTHING = Awaited()


class FakeStep:
    """A Step whose answers the test sets."""

    def __init__(self, where: str, awaited: Awaited = NOTHING, open_: bool = True) -> None:
        self.where = where
        self._awaited = awaited
        self.open = open_

    def is_open(self) -> bool:
        return self.open

    def awaited(self) -> Awaited:
        return self._awaited


# -- Awaited -----------------------------------------------------------------------


def test_awaited_is_true_only_while_it_waits_on_someone() -> None:
    assert not Awaited()
    assert not Awaited(members=(0, 1, 2))
    assert Awaited(receiving=(1,))
    assert Awaited(sending=(2,))


@pytest.mark.parametrize(
    ("awaited", "words"),
    [
        (Awaited(), ""),
        (Awaited(receiving=(2,)), "still waiting for rank 2"),
        (Awaited(receiving=(2, 3)), "still waiting for ranks [2, 3]"),
        (Awaited(sending=(1,)), "still sending to rank 1"),
        (Awaited((0, 3), (1,)), "still waiting for ranks [0, 3]; still sending to rank 1"),
        # members equal to the group ranks (the world): no "(global ...)"
        (Awaited(receiving=(1, 2), members=(0, 1, 2)), "still waiting for ranks [1, 2]"),
        # a subgroup of global ranks [4, 6, 7]
        (Awaited(receiving=(1,), members=(4, 6, 7)), "still waiting for rank 1 (global 6)"),
        (Awaited(receiving=(0, 2), members=(4, 6, 7)), "still waiting for ranks [0, 2] (global [4, 7])"),
        (
            Awaited((2,), (0,), members=(4, 6, 7)),
            "still waiting for rank 2 (global 7); still sending to rank 0 (global 4)",
        ),
        # ranks that happen to keep their number in a subgroup are not repeated
        (Awaited(receiving=(0, 1), members=(0, 1, 5)), "still waiting for ranks [0, 1]"),
    ],
)
def test_describe_names_group_ranks_and_their_global_ranks(awaited: Awaited, words: str) -> None:
    assert awaited.describe() == words


def test_merged_is_the_sorted_union_and_keeps_the_first_known_members() -> None:
    a = Awaited(receiving=(3, 1), sending=(2,), members=())
    b = Awaited(receiving=(1, 0), sending=(2, 4), members=(10, 11, 12, 13, 14))
    merged = a.merged(b)
    assert merged == Awaited(receiving=(0, 1, 3), sending=(2, 4), members=(10, 11, 12, 13, 14))
    assert Awaited(members=(5, 6)).merged(b).members == (5, 6)


# -- timeout_message ------------------------------------------------------------------


def test_timeout_message_words() -> None:
    where = "all_reduce(sum, float64[4]) (call #7 in group 'world')"
    assert (
        timeout_message(0, where, 0.5, Awaited(receiving=(2, 3)), why=WAIT_TIMEOUT)
        == "rank 0: all_reduce(sum, float64[4]) (call #7 in group 'world') Timed out after 0.5 s "
        "(Work.wait timeout); still waiting for ranks [2, 3]"
    )
    assert (
        timeout_message(3, "send to rank 1 (tag 7, group 'world')", 30.0, Awaited(sending=(1,)))
        == "rank 3: send to rank 1 (tag 7, group 'world') Timed out after 30 s; still sending to rank 1"
    )
    # nothing awaited: no trailing "; "
    assert timeout_message(1, "barrier", 1800.0, Awaited()) == "rank 1: barrier Timed out after 1800 s"
    assert WAIT_TIMEOUT == " (Work.wait timeout)"


# -- Progress ------------------------------------------------------------------------


def test_progress_names_the_open_steps_that_wait_on_peers() -> None:
    finished = FakeStep("all_reduce (call #1 in group 'w')", Awaited(receiving=(1,)), open_=False)
    idle = FakeStep("all_reduce (call #3 in group 'w')")
    running = FakeStep("all_reduce (call #2 in group 'w')", Awaited(receiving=(2,), members=(0, 1, 5)))
    sending = FakeStep("all_reduce (call #4 in group 'w')", Awaited(sending=(1,), members=(0, 1, 5)))
    progress = Progress(0, "all_reduce_coalesced on group 'w'", [finished, idle])
    progress.add(running)
    progress.add(sending)
    error = progress.timeout_error(2.5)
    assert isinstance(error, OperationTimeoutError)
    assert str(error) == (
        "rank 0: all_reduce (call #2 in group 'w') and all_reduce (call #4 in group 'w') Timed out "
        "after 2.5 s (Work.wait timeout); still waiting for rank 2 (global 5); still sending to rank 1"
    )


def test_progress_names_every_open_step_when_none_waits_yet() -> None:
    steps = [FakeStep("a (call #1 in group 'w')"), FakeStep("b", open_=False), FakeStep("c (call #2 in group 'w')")]
    error = Progress(4, "op", steps).timeout_error(1)
    assert str(error) == (
        "rank 4: a (call #1 in group 'w') and c (call #2 in group 'w') Timed out after 1 s (Work.wait timeout)"
    )


def test_progress_names_the_operation_when_no_step_is_open() -> None:
    assert str(Progress(2, "broadcast on group 'world'").timeout_error(0.25)) == (
        "rank 2: broadcast on group 'world' Timed out after 0.25 s (Work.wait timeout)"
    )
    closed = FakeStep("x", Awaited(receiving=(1,)), open_=False)
    assert str(Progress(2, "gather on group 'g'", [closed]).timeout_error(3)) == (
        "rank 2: gather on group 'g' Timed out after 3 s (Work.wait timeout)"
    )


def test_progress_reads_the_steps_at_the_moment_it_is_asked() -> None:
    step = FakeStep("recv (call #1 in group 'w')", Awaited(receiving=(1, 2)))
    progress = Progress(0, "op", [step])
    assert str(progress.timeout_error(1)).endswith("still waiting for ranks [1, 2]")
    step._awaited = Awaited(receiving=(2,))
    assert str(progress.timeout_error(1)).endswith("still waiting for rank 2")
    step.open = False
    assert str(progress.timeout_error(1)) == "rank 0: op Timed out after 1 s (Work.wait timeout)"


# -- register / context_for ------------------------------------------------------------


def test_register_outside_a_work_records_nothing() -> None:
    progress = Progress(0, "op")
    register(FakeStep("stray", Awaited(receiving=(1,))))
    assert str(progress.timeout_error(1)) == "rank 0: op Timed out after 1 s (Work.wait timeout)"


async def test_register_reports_to_the_progress_of_its_context_and_its_tasks() -> None:
    progress, other = Progress(0, "first"), Progress(1, "second")

    async def operation(name: str) -> None:
        register(FakeStep(f"{name} (call #1 in group 'w')", Awaited(receiving=(1,))))
        # a task started by the operation inherits its context
        await asyncio.create_task(_register_later(f"{name}-child (call #2 in group 'w')"))

    async def _register_later(where: str) -> None:
        register(FakeStep(where, Awaited(receiving=(2,))))

    loop = asyncio.get_running_loop()
    first = context_for(progress)
    second = context_for(other)
    await asyncio.gather(
        loop.create_task(operation("a"), context=first), loop.create_task(operation("b"), context=second)
    )
    assert str(progress.timeout_error(1)) == (
        "rank 0: a (call #1 in group 'w') and a-child (call #2 in group 'w') Timed out after 1 s "
        "(Work.wait timeout); still waiting for ranks [1, 2]"
    )
    assert str(other.timeout_error(1)).startswith("rank 1: b (call #1 in group 'w') and b-child (call #2 in group 'w')")
    # the caller's own context is untouched: a step registered here goes nowhere
    register(FakeStep("outside", Awaited(receiving=(3,))))
    assert "outside" not in str(progress.timeout_error(1)) + str(other.timeout_error(1))


def test_context_for_is_a_copy_that_keeps_the_callers_variables() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("test_var", default="unset")
    var.set("caller's")
    progress = Progress(0, "op")
    context = context_for(progress)
    assert context.run(var.get) == "caller's"
    context.run(var.set, "inside")
    assert var.get() == "caller's"  # a copy: setting inside leaves the caller alone
    context.run(register, FakeStep("s", Awaited(sending=(1,))))
    assert str(progress.timeout_error(1)).endswith("; still sending to rank 1")


# -- the same words from real operations ---------------------------------------------------


async def test_a_work_wait_on_a_stuck_collective_call_names_it_and_the_missing_rank() -> None:
    # Group "rot" of global ranks [2, 0, 1]: group rank 0 (global 2) receives
    # from group ranks 1 and 2; group rank 2 (global 1) holds back.
    async with local_world(3) as ranks:
        groups = [w.new_group([2, 0, 1], name="rot") for w in ranks]
        stuck, release = asyncio.Event(), asyncio.Event()
        got = np.zeros(2, np.int64)
        work_holder: list[Work] = []

        async def receiver(g) -> None:
            channel = g.channel("probe(int64[1])")

            async def algorithm() -> None:
                first = as_host_buffer(got[:1], writable=True)
                await channel.recv(first, 1)
                second = channel.start_recv(as_host_buffer(got[1:], writable=True), 2)
                stuck.set()
                await channel.wait_recv(second, 2)

            await channel.run(algorithm())

        async def sender(g, value: int, wait_for: asyncio.Event | None) -> None:
            channel = g.channel("probe(int64[1])")
            if wait_for is not None:
                await wait_for.wait()
            await channel.run(channel.send(as_host_buffer(np.array([value], np.int64)), 0))

        async def driver() -> None:
            work = Work.start(lambda: receiver(groups[2]), "probe on group 'rot'", rank=2)
            work_holder.append(work)
            await stuck.wait()
            with pytest.raises(OperationTimeoutError) as caught:
                await asyncio.to_thread(work.wait, 0.05)
            assert str(caught.value) == (
                "rank 2: probe(int64[1]) (call #1 in group 'rot') Timed out after 0.05 s "
                "(Work.wait timeout); still waiting for rank 2 (global 1)"
            )
            assert not work.is_completed()  # a wait that gave up does not end the operation
            release.set()
            await work

        await asyncio.gather(driver(), sender(groups[0], 10, None), sender(groups[1], 20, release))
        assert got.tolist() == [10, 20]
        assert work_holder[0].is_success()


async def test_a_work_wait_on_a_receive_names_the_sender_and_the_groups_deadline_uses_the_same_words() -> None:
    async with local_world(2) as ranks:
        buf = np.zeros(3, np.float32)
        work = ranks[0].irecv(buf, src=1, tag=5)
        with pytest.raises(OperationTimeoutError) as caught:
            await asyncio.to_thread(work.wait, 0.05)
        assert str(caught.value) == (
            "rank 0: recv from rank 1 (tag 5, group 'local2') Timed out after 0.05 s "
            "(Work.wait timeout); still waiting for rank 1"
        )
        await ranks[1].send(np.arange(3, dtype=np.float32), dst=0, tag=5)
        assert await work == 1
        assert buf.tolist() == [0.0, 1.0, 2.0]

        # the group's own deadline: the same wording, without "(Work.wait timeout)"
        shorts = [w.new_group(timeout=0.1, name="short") for w in ranks]
        with pytest.raises(OperationTimeoutError) as caught:
            await shorts[1].recv(np.zeros(1), src=0, tag=2)
        assert str(caught.value) == (
            "rank 1: recv from rank 0 (tag 2, group 'short') Timed out after 0.1 s; still waiting for rank 0"
        )

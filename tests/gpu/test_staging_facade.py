"""torch's stream rules through the blocking facade, and timeouts of staged operations.

The facade runs every operation on its loop thread, while torch's current
stream is per thread: the operation must follow the *caller's* stream, and
``Work.wait()`` must make the *waiting* thread's stream wait. A one-rank
world shows it: PREMUL_SUM scales the input, so the result says which
values the copy read and whether the reader's stream waited for the copy back.
"""

from __future__ import annotations

import numpy as np
import pytest

import asyncdist as dist
from asyncdist.errors import AsyncDistError, OperationTimeoutError
from asyncdist.loop.thread import CALLER_RUNS_ENV
from asyncdist.rendezvous.hash_store import HashStore
from asyncdist.reduce.op import make_premul_sum
from asyncdist.testing.fake_device import FakeDevice

VALUES = np.array([1.0, 2.0, 3.0, 4.0])


HANDED_OVER = "handed to the loop thread"


@pytest.fixture
def one_rank(request, monkeypatch, fake):
    """A one-rank world. Its blocking calls run the loop in the calling thread,
    or with the parameter ``HANDED_OVER`` go to the daemon, which must then be
    told the caller's streams."""
    if getattr(request, "param", None) == HANDED_OVER:
        monkeypatch.setenv(CALLER_RUNS_ENV, "0")
    dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
    try:
        yield FakeDevice()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("one_rank", ["caller runs the loop", HANDED_OVER], indirect=True)
def test_blocking_call_follows_the_callers_stream(one_rank):
    dev = one_rank
    user = dev.new_stream("user")
    with dev.stream(user):  # the caller's current stream is not the loop thread's
        x = dev.empty(4, np.float64)
        dev.fill(x, VALUES)  # queued on the caller's stream, not run yet
        dist.all_reduce(x, op=make_premul_sum(2.0))
        np.testing.assert_array_equal(dev.probe(x), 2 * VALUES)


def test_async_work_wait_makes_the_waiting_stream_wait(one_rank):
    dev = one_rank
    user, later = dev.new_stream("user"), dev.new_stream("later")
    with dev.stream(user):
        x = dev.empty(4, np.float64)
        dev.fill(x, VALUES)
        work = dist.all_reduce(x, op=make_premul_sum(3.0), async_op=True)
    with dev.stream(later):
        work.wait()
        np.testing.assert_array_equal(dev.probe(x), 3 * VALUES)


def test_blocking_p2p_free_functions_take_device_tensors(one_rank):
    dev = one_rank
    out = [dev.empty(4, np.float64)]
    dist.all_gather(out, dev.array(VALUES))
    np.testing.assert_array_equal(dev.probe(out[0]), VALUES)


def test_a_copy_that_never_finishes_times_out(worlds, fake_only):
    """A device whose stream is stuck fails the operation with the group's timeout,
    on its rank, and the other ranks' matching call fails too."""

    async def body(r):
        quick = r.g.new_group(timeout=0.5)  # every rank makes it, in the same order
        x = r.put(np.ones(3))
        hold = r.dev.hold() if r.g.rank == 0 else None
        try:
            await quick.all_reduce(x)
        except AsyncDistError as exc:
            return exc
        finally:
            if hold is not None:
                hold.release()
                r.dev.run_stream()
        return None

    errors = worlds.run(2, body)
    assert isinstance(errors[0], OperationTimeoutError) and "device" in str(errors[0])
    assert isinstance(errors[1], AsyncDistError)

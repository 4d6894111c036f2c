"""asyncdist's errors through torch's API: a mismatch, a timeout, a dead peer."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest

from asyncdist.errors import CollectiveMismatchError, OperationTimeoutError, PeerLostError
from asyncdist.testing import spawn

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from test_torch_collectives import init  # noqa: E402  (same directory; torch is needed first)


def mismatch_then_timeout(path: Path) -> dict:
    rank, _ = init(path)
    got: dict = {}
    try:
        dist.all_reduce(torch.ones(4 + rank))  # the ranks disagree on the size
    except CollectiveMismatchError as exc:
        got["sync"] = str(exc)
    work = dist.all_reduce(torch.ones(2, dtype=torch.float64 if rank else torch.float32), async_op=True)
    try:
        work.wait()
    except CollectiveMismatchError as exc:
        got["async"] = str(exc)
    # Wait with a timeout: rank 1 joins the call late, so rank 0's first wait gives up.
    if rank == 1:
        time.sleep(1.0)
    work = dist.all_reduce(torch.ones(3), async_op=True)
    if rank == 0:
        start = time.monotonic()
        try:
            work.wait(timedelta(seconds=0.2))
        except OperationTimeoutError as exc:
            got["timeout"] = (str(exc), time.monotonic() - start)
    got["later"] = work.wait() and work.is_success() and work.result()[0].tolist() == [2.0] * 3
    dist.destroy_process_group()
    return got


def test_a_mismatch_and_a_timeout_surface_in_work_wait(tmp_path: Path) -> None:
    ranks = spawn(2, mismatch_then_timeout, tmp_path / "store", timeout=60)
    for rank, got in enumerate(ranks):
        assert "rank 0 called all_reduce(sum, float32[4])" in got["sync"], got["sync"]
        assert "rank 1 called all_reduce(sum, float32[5])" in got["sync"], got["sync"]
        assert "float64[2]" in got["async"] and "float32[2]" in got["async"], got["async"]
        assert got["later"] is True
    message, waited = ranks[0]["timeout"]
    # The call (#4 after init's barrier and the two above), the group, and the rank still awaited.
    assert message.startswith("rank 0: all_reduce(sum, float32[3]) (call #3 in group 'torch:"), message
    assert message.endswith("Timed out after 0.2 s (Work.wait timeout); still waiting for rank 1"), message
    assert waited < 1.0


def lose_a_peer(path: Path) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, _ = init(path)
    model = DDP(torch.nn.Linear(4, 4))
    if rank == 1:
        return {}  # leaves: the process exits without closing its group
    time.sleep(1.0)
    got: dict = {}
    try:
        model(torch.randn(2, 4)).sum().backward()  # DDP's all-reduce, through C++ and a torch future
    except RuntimeError as exc:
        got["ddp"] = str(exc)
    try:
        dist.all_reduce(torch.ones(2), async_op=True).wait()
    except PeerLostError as exc:
        got["wait"] = (str(exc), exc.rank)
    return got


def test_a_dead_peer_surfaces_in_ddp_and_in_work_wait_naming_the_rank(tmp_path: Path) -> None:
    got = spawn(2, lose_a_peer, tmp_path / "store", timeout=60)[0]
    assert "PeerLostError" in got["ddp"] and "rank 1" in got["ddp"], got["ddp"]
    message, lost = got["wait"]
    assert lost == 1 and "rank 1" in message


def test_a_shutdown_refused_on_the_loop_thread_leaves_the_group_open_until_shut_down_elsewhere() -> None:
    from asyncdist.errors import WrongThreadError
    from asyncdist.torch_backend.backend import create_group

    group = create_group(dist.HashStore(), 0, 1, timedelta(seconds=30), group_name="solo", store_prefix="solo")
    closed: list = []
    group._group.on_close(lambda: closed.append(True))
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    with pytest.raises(WrongThreadError, match="destroy_process_group"):
        group._portal.call(group.shutdown)  # in asyncdist's own loop: refused before anything closes
    x = torch.arange(3.0)
    group.allreduce([x], opts).wait()  # still open: a sum over one rank
    assert x.tolist() == [0.0, 1.0, 2.0] and closed == []
    group.shutdown()  # from this thread: closed now, once
    group.shutdown()
    assert closed == [True]


def test_an_operation_after_the_last_group_shut_down_raises_closed_error() -> None:
    from asyncdist.errors import ClosedError
    from asyncdist.torch_backend.backend import create_group

    group = create_group(dist.HashStore(), 0, 1, timedelta(seconds=30), group_name="gone", store_prefix="gone")
    group.shutdown()  # the last group: its loop thread stops with it
    sync, async_ = dist.AllreduceOptions(), dist.AllreduceOptions()
    sync.asyncOp, async_.asyncOp = False, True
    for opts in (sync, async_):
        with pytest.raises(ClosedError, match="all_reduce was called after .* shut down"):
            group.allreduce([torch.arange(3.0)], opts).wait()

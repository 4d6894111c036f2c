"""ProcessGroupAsyncdist on its own: configure per quorum, abort, errored.

Two replicas in this process, each configured from its own thread (as
torchft's Manager configures from its quorum thread), over a TCPStore
served here.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Iterator

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchft")

from torch.distributed import AllreduceOptions, ReduceOp, TCPStore  # noqa: E402

from asyncdist.errors import ClosedError, PeerLostError, RankExcludedError  # noqa: E402
from asyncdist.testing import crash  # noqa: E402
from asyncdist.torchft import ProcessGroupAsyncdist  # noqa: E402

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def store() -> Iterator[TCPStore]:
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    yield server


@pytest.fixture
def pgs() -> Iterator[list[ProcessGroupAsyncdist]]:
    groups = [ProcessGroupAsyncdist(timedelta(seconds=20)) for _ in range(2)]
    yield groups
    for pg in groups:
        pg.shutdown()


def configure(pgs: list[ProcessGroupAsyncdist], store: TCPStore, quorum: int) -> None:
    """Configure both replicas for ``quorum`` at once, each from its own thread."""
    address = f"127.0.0.1:{store.port}/torchft/{quorum}/0"
    with ThreadPoolExecutor(len(pgs)) as pool:
        done = [pool.submit(pg.configure, address, f"replica_{r}", r, len(pgs), quorum) for r, pg in enumerate(pgs)]
        for future in done:
            future.result(timeout=30)


def all_reduce(pg: ProcessGroupAsyncdist, tensor: torch.Tensor):  # noqa: ANN201 (torch's Work)
    opts = AllreduceOptions()
    opts.reduceOp = ReduceOp.SUM
    return pg.allreduce([tensor], opts)


def test_each_quorum_gets_a_fresh_group(store: TCPStore, pgs: list[ProcessGroupAsyncdist]) -> None:
    for quorum in (1, 2):
        configure(pgs, store, quorum)
        tensors = [torch.arange(5, dtype=torch.float32) * (r + quorum) for r in range(2)]
        works = [all_reduce(pg, t) for pg, t in zip(pgs, tensors)]
        assert [w.wait() for w in works] == [True, True]
        expected = torch.arange(5, dtype=torch.float32) * (2 * quorum + 1)
        for tensor in tensors:
            torch.testing.assert_close(tensor, expected)
        assert pgs[0].size() == 2 and pgs[0].getBackendName() == "torchft-asyncdist"
        assert f"torchft quorum {quorum}" in repr(pgs[1])
        assert [pg.errored() for pg in pgs] == [None, None]


def test_abort_fails_an_outstanding_all_reduce_at_once_naming_the_rank_it_waited_for(
        store: TCPStore, pgs: list[ProcessGroupAsyncdist]) -> None:
    configure(pgs, store, 1)
    work = all_reduce(pgs[0], torch.ones(3))  # replica 1 never joins it
    pgs[0].abort()
    # Failed by the time abort returns: no wait for a timeout.
    assert work.is_completed() and not work.is_success()
    error = work.exception()
    assert isinstance(error, PeerLostError) and error.rank == 1, error
    assert str(error).startswith("rank 0: all_reduce(sum, float32[3])"), error
    assert str(error).endswith("was aborted (torchft) while it waited for rank 1"), error
    assert pgs[0].errored() is error
    assert work.wait() is False  # torchft's Manager reads the error from the future and errored()
    with pytest.raises(RuntimeError, match="PeerLostError: rank 0: all_reduce"):
        work.get_future().wait()
    with pytest.raises(ClosedError, match="configure"):
        all_reduce(pgs[0], torch.ones(3))
    # Replica 1 was dropped from that quorum's group: its next operation there fails at once too.
    late = all_reduce(pgs[1], torch.ones(3))
    assert late.wait() is False
    assert isinstance(pgs[1].errored(), RankExcludedError) and "rank 0 aborted" in str(pgs[1].errored())
    # The next quorum starts clean.
    configure(pgs, store, 2)
    assert [pg.errored() for pg in pgs] == [None, None]
    tensors = [torch.ones(2), torch.ones(2)]
    works = [all_reduce(pg, t) for pg, t in zip(pgs, tensors)]
    assert [w.wait() for w in works] == [True, True]
    assert tensors[0].tolist() == [2.0, 2.0]


def test_errored_reports_a_lost_peer_naming_it(store: TCPStore, pgs: list[ProcessGroupAsyncdist]) -> None:
    configure(pgs, store, 1)
    assert pgs[0].errored() is None
    work = all_reduce(pgs[0], torch.ones(4))
    lost = pgs[1].parent
    lost.loop_thread.call(crash, lost.asyncdist_group)  # replica 1's connections reset, as under SIGKILL
    assert work.wait() is False
    error = pgs[0].errored()
    assert isinstance(error, PeerLostError) and error.rank == 1, error
    assert work.exception() is error
    pgs[0].abort()  # what was lost is lost: abort names it again, and leaves the error as it was
    assert pgs[0].errored() is error


def test_abort_without_a_group_and_errored_before_any(pgs: list[ProcessGroupAsyncdist]) -> None:
    assert pgs[0].errored() is None
    pgs[0].abort()  # nothing to abort
    with pytest.raises(ClosedError, match="never configured"):
        all_reduce(pgs[0], torch.ones(1))

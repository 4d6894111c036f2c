"""torch.profiler sees asyncdist: one ``asyncdist:<op>`` event per call, with
input shapes. Through torch's API the events are gloo's: the same calls,
profiled on gloo and on asyncdist in the same processes, give events with the
same names (but the prefix), count, ``is_async`` and input shapes. Through
the facade they are synchronous events around the call."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pytest

from asyncdist.testing import spawn

torch = pytest.importorskip("torch")

Event = tuple[str, bool, list]


def _events(profile: object, prefix: str) -> list[Event]:
    """(name less ``prefix:``, is_async, input shapes) of each event of the backend."""
    return [(e.name.split(":", 1)[1], e.is_async, e.input_shapes)
            for e in profile.events() if e.name.startswith(f"{prefix}:")]  # type: ignore[attr-defined]


def _facade_calls(api: object, rank: int) -> None:
    t = torch.ones(4)
    api.all_reduce(t)  # type: ignore[attr-defined]
    api.broadcast(t, src=0, async_op=True).wait()  # type: ignore[attr-defined]
    api.all_gather([torch.zeros(3), torch.zeros(3)], torch.ones(3))  # type: ignore[attr-defined]
    if rank == 0:
        api.isend(torch.ones(2, 3), dst=1).wait()  # type: ignore[attr-defined]
        api.send(torch.ones(5), dst=1)  # type: ignore[attr-defined]
    else:
        api.irecv(torch.zeros(2, 3), src=0).wait()  # type: ignore[attr-defined]
        api.recv(torch.zeros(5))  # type: ignore[attr-defined]


def _torch_calls(rank: int) -> None:
    """A call of each kind whose gloo event is one event named after the call."""
    import torch.distributed as tdist

    t = torch.ones(4)
    tdist.all_reduce(t)
    tdist.broadcast(t, src=0, async_op=True).wait()
    tdist.reduce(torch.ones(4), dst=0)
    tdist.all_reduce_coalesced([torch.ones(2), torch.ones(3)])
    tdist.all_gather([torch.zeros(3), torch.zeros(3)], torch.ones(3))
    tdist.all_gather_into_tensor(torch.zeros(6), torch.ones(3))
    tdist.all_gather_coalesced([[torch.zeros(2), torch.zeros(3)] for _ in range(2)], [torch.ones(2), torch.ones(3)])
    tdist.gather(torch.ones(3), [torch.zeros(3), torch.zeros(3)] if rank == 0 else None, dst=0)
    tdist.scatter(torch.zeros(3), [torch.ones(3), torch.ones(3)] if rank == 0 else None, src=0)
    tdist.all_to_all_single(torch.zeros(4), torch.ones(4))
    tdist.all_to_all([torch.zeros(2), torch.zeros(2)], [torch.ones(2), torch.ones(2)])
    tdist.barrier()
    if rank == 0:
        tdist.isend(torch.ones(2, 3), dst=1).wait()
        tdist.send(torch.ones(5), dst=1)
        tdist.send(torch.ones(7), dst=1)
    else:
        tdist.irecv(torch.zeros(2, 3), src=0).wait()
        tdist.recv(torch.zeros(5), src=0)
        tdist.recv(torch.zeros(7))  # from any source


def _gives_up_then_completes(rank: int) -> None:
    """Under the profiler, a wait that gives up raises at once (the event stays open)
    and the receive completes later: rank 0 sends only after it gave up. Not on gloo,
    whose timed-out wait closes the connection."""
    import torch.distributed as tdist

    if rank == 1:
        work = tdist.irecv(torch.zeros(1), src=0)
        with pytest.raises(RuntimeError):
            work.wait(timedelta(milliseconds=10))
        tdist.barrier()
        work.wait()
    else:
        tdist.barrier()
        tdist.send(torch.ones(1), dst=1)


def _profile_torch(backend: str, path: Path, rank: int) -> list[Event]:
    import torch.distributed as tdist

    tdist.init_process_group(backend, init_method=f"file://{path}", rank=rank, world_size=2,
                             timeout=timedelta(seconds=60))
    with torch.profiler.profile(record_shapes=True) as profile:
        _torch_calls(rank)
        tdist.reduce_scatter_tensor(torch.zeros(2), torch.ones(4))  # gloo: an all_reduce (see below)
        if backend == "asyncdist":
            _gives_up_then_completes(rank)
    tdist.destroy_process_group()
    return _events(profile, backend)


def profile_all(tmp: Path) -> dict:
    import asyncdist as dist
    import asyncdist.torch_backend  # noqa: F401  (registers "asyncdist")

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    dist.init_process_group()
    with torch.profiler.profile(record_shapes=True) as profile:
        _facade_calls(dist, rank)
    facade = _events(profile, "asyncdist")
    dist.destroy_process_group()
    return {"facade": facade, "gloo": _profile_torch("gloo", tmp / "gloo", rank),
            "asyncdist": _profile_torch("asyncdist", tmp / "asyncdist", rank)}


def test_events_match_gloos_through_torch_and_are_synchronous_through_the_facade(tmp_path: Path) -> None:
    results = spawn(2, profile_all, tmp_path)
    for rank, found in enumerate(results):
        *asyncdist_events, reduce_scatter, first, second = found["asyncdist"]
        gave_up = [("recv", True, [[1]]), ("barrier", True, [])]  # _gives_up_then_completes
        assert [first, second] == (gave_up if rank == 1 else [("barrier", True, []), ("send", True, [[1]])])
        *gloo_events, gloo_reduce_scatter = found["gloo"]
        assert asyncdist_events == gloo_events, (rank, asyncdist_events, gloo_events)
        # gloo implements reduce_scatter_tensor as an all_reduce of the input, and records that;
        # asyncdist records the operation it runs, with the same input shapes.
        assert gloo_reduce_scatter == ("all_reduce", True, [[4]])
        assert reduce_scatter == ("reduce_scatter_tensor", True, [[4]])
        # Independent of gloo: the events these calls must give.
        recvs = [("recv", [[2, 3]]), ("recv", [[5]]), ("recvAnySource", [[7]])]
        p2p = [("send", [[2, 3]]), ("send", [[5]]), ("send", [[7]])] if rank == 0 else recvs
        scattered = [[3], [3]] if rank == 0 else []
        assert [(name, shapes) for name, _, shapes in asyncdist_events] == [
            ("all_reduce", [[4]]), ("broadcast", [[4]]), ("reduce", [[4]]), ("all_reduce", [[2], [3]]),
            ("all_gather", [[3]]), ("all_gather", [[3]]), ("all_gather", [[2], [3]]), ("gather", [[3]]),
            ("scatter", scattered), ("all_to_all", [[4]]), ("all_to_all", [[2], [2]]), ("barrier", []), *p2p]
        assert all(is_async for _, is_async, _ in asyncdist_events)
        p2p_facade = [("isend", False, [[2, 3]]), ("send", False, [[5]])] if rank == 0 else \
            [("irecv", False, [[2, 3]]), ("recvAnySource", False, [[5]])]
        assert found["facade"] == [("all_reduce", False, [[4]]), ("broadcast", False, [[4]]),
                                   ("all_gather", False, [[3]]), *p2p_facade], (rank, found["facade"])

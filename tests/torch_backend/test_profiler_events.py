"""torch.profiler sees asyncdist: one ``asyncdist:<op>`` event per call, with
input shapes, through the facade and through torch's own API on the backend."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pytest

from asyncdist.testing import spawn

torch = pytest.importorskip("torch")


def _events(profile: object) -> list[tuple[str, list]]:
    return [(e.name, e.input_shapes) for e in profile.events() if e.name.startswith("asyncdist:")]  # type: ignore[attr-defined]


def _calls(api: object, rank: int) -> None:
    """The same calls through either API: a collective, an async one, and p2p both ways."""
    t = torch.ones(4)
    api.all_reduce(t)  # type: ignore[attr-defined]
    api.broadcast(t, src=0, async_op=True).wait()  # type: ignore[attr-defined]
    if rank == 0:
        api.isend(torch.ones(2, 3), dst=1).wait()  # type: ignore[attr-defined]
        api.send(torch.ones(5), dst=1)  # type: ignore[attr-defined]
    else:
        api.irecv(torch.zeros(2, 3), src=0).wait()  # type: ignore[attr-defined]
        api.recv(torch.zeros(5), src=0)  # type: ignore[attr-defined]


def profile_both_apis(path: Path) -> dict:
    import torch.distributed as tdist

    import asyncdist as dist
    import asyncdist.torch_backend  # noqa: F401  (registers "asyncdist")

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    found = {}
    dist.init_process_group()
    with torch.profiler.profile(record_shapes=True) as profile:
        _calls(dist, rank)
    found["facade"] = _events(profile)
    dist.destroy_process_group()
    tdist.init_process_group("asyncdist", init_method=f"file://{path}", rank=rank, world_size=2,
                             timeout=timedelta(seconds=60))
    with torch.profiler.profile(record_shapes=True) as profile:
        _calls(tdist, rank)
    found["torch"] = _events(profile)
    tdist.destroy_process_group()
    return found


def test_each_call_records_one_asyncdist_event_with_its_shapes(tmp_path: Path) -> None:
    results = spawn(2, profile_both_apis, tmp_path / "store")
    for rank, found in enumerate(results):
        p2p = [("asyncdist:isend", [[2, 3]]), ("asyncdist:send", [[5]])] if rank == 0 else \
            [("asyncdist:irecv", [[2, 3]]), ("asyncdist:recv", [[5]])]
        expected = [("asyncdist:all_reduce", [[4]]), ("asyncdist:broadcast", [[4]]), *p2p]
        assert found["facade"] == expected, (rank, found["facade"])
        # torch's isend and send both reach the backend's send (irecv and recv its recv).
        through_torch = [(name.replace(":i", ":"), shapes) for name, shapes in expected]
        assert found["torch"] == through_torch, (rank, found["torch"])

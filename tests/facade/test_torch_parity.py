"""Parity with torch.distributed's namespace: every public name of torch's
module exists in ``asyncdist``, with the same parameters, unless it is in
:data:`OMISSIONS` with its reason.

The walk covers ``dir(torch.distributed)`` after ``import torch.distributed``,
less private names and submodules (``rpc``, ``fsdp``, ``tensor``,
``checkpoint``, ``pipelining``, ``algorithms``, ... are other subsystems;
``distributed_c10d``, ``constants`` and the like are where the names below
come from). A torch upgrade that adds a name fails here until the name is
served or listed.
"""

from __future__ import annotations

import inspect
import types

import pytest

import asyncdist
from asyncdist.testing import spawn

torch = pytest.importorskip("torch")
tdist = pytest.importorskip("torch.distributed")

pytestmark = pytest.mark.filterwarnings("ignore:`torch.distributed.reduce_op` is deprecated:FutureWarning")

#: torch.distributed's public names that asyncdist deliberately does not serve, and why.
OMISSIONS = {
    # other subsystems, reached through torch with backend="asyncdist"
    "DeviceMesh": "torch.distributed.device_mesh, DTensor's subsystem: use it from torch with backend='asyncdist'",
    "init_device_mesh": "torch.distributed.device_mesh, DTensor's subsystem: use it from torch with backend='asyncdist'",
    "GradBucket": "DistributedDataParallel's C++ internals: DDP runs over asyncdist from torch, backend='asyncdist'",
    "Reducer": "DistributedDataParallel's C++ internals: DDP runs over asyncdist from torch, backend='asyncdist'",
    "Logger": "DistributedDataParallel's C++ internals: DDP runs over asyncdist from torch, backend='asyncdist'",
    "BuiltinCommHookType": "DistributedDataParallel's communication hooks: DDP runs over asyncdist from torch",
    "ProcessGroupGloo": "gloo's own group class: asyncdist runs the 'gloo' name itself; its groups are asyncdist.ProcessGroup",
    # names asyncdist gives to something else
    "rendezvous": "asyncdist.rendezvous is the package of init methods and stores; torch's generator yields torch stores",
    "register_rendezvous_handler": "asyncdist's init methods are env://, tcp:// and file://; schemes are not pluggable",
    # torch's module internals, not API
    "log": "torch.distributed's module logger",
    "timedelta": "datetime.timedelta, imported by torch's module",
}


#: Parameters torch requires that asyncdist lets the caller leave out, and why.
OPTIONAL_HERE = {
    ("shrink_group", "ranks_to_exclude"): "left out, the ranks known lost are excluded (docs/fault-tolerance.md)",
}


def _torch_names() -> list[str]:
    return sorted(
        name
        for name in dir(tdist)
        if not name.startswith("_") and not isinstance(getattr(tdist, name), types.ModuleType)
    )


def test_every_torch_name_is_served_or_listed() -> None:
    missing = []
    for name in _torch_names():
        theirs = getattr(tdist, name)
        ours = getattr(asyncdist, name, None)
        served = ours is not None and (callable(ours) or not callable(theirs)) and not isinstance(ours, types.ModuleType)
        if not served and name not in OMISSIONS:
            missing.append(name)
    assert missing == [], f"torch.distributed names asyncdist lacks (serve them or list them in OMISSIONS): {missing}"


def test_the_omissions_are_current() -> None:
    names = set(_torch_names())
    stale = [name for name in OMISSIONS if name not in names]
    assert stale == [], f"OMISSIONS lists names torch.distributed no longer has: {stale}"
    served = [name for name in OMISSIONS if callable(getattr(asyncdist, name, None)) and name != "rendezvous"]
    assert served == [], f"OMISSIONS lists names asyncdist now serves: {served}"


def _parameters(fn) -> list[tuple[str, str]] | None:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without one
        return None
    return [
        (p.name, "" if p.default is inspect.Parameter.empty else repr(p.default))
        for p in signature.parameters.values()
        if not p.name.startswith("_")  # torch's private knobs (init_process_group's _ranks)
    ]


def test_functions_have_torchs_parameters() -> None:
    differ = []
    for name in _torch_names():
        theirs, ours = getattr(tdist, name), getattr(asyncdist, name, None)
        if name in OMISSIONS or not inspect.isfunction(theirs) or ours is None:
            continue
        want = _parameters(inspect.unwrap(theirs))
        if want is not None:
            want = [(p, "None" if (name, p) in OPTIONAL_HERE else default) for p, default in want]
        if want is not None and _parameters(ours) != want:
            differ.append(f"{name}: torch {want}, asyncdist {_parameters(ours)}")
    assert differ == []


def test_dist_errors_are_torchs() -> None:
    # What the torch.backends entry point does when torch is imported after
    # asyncdist (as here), for a checkout where it is not installed.
    asyncdist._torch.torch_or_none()
    for name in ("DistError", "DistBackendError", "DistNetworkError", "DistStoreError", "QueueEmptyError"):
        assert issubclass(getattr(asyncdist, name), getattr(tdist, name)), name
    with pytest.raises(tdist.DistNetworkError):
        raise asyncdist.errors.PeerLostError("rank 0: rank 1 is gone", rank=1)


def test_constants_and_enums() -> None:
    assert asyncdist.Backend.GLOO == asyncdist.Backend("GLOO") == tdist.Backend.GLOO == "gloo"
    assert asyncdist.Backend("asyncdist") == asyncdist.Backend.ASYNCDIST
    assert asyncdist.default_pg_timeout == tdist.default_pg_timeout
    assert asyncdist.is_gloo_available() and not asyncdist.is_mpi_available()
    assert asyncdist.is_backend_available("gloo") and asyncdist.is_backend_available("cpu:asyncdist")
    assert not asyncdist.is_backend_available("mpi")
    assert asyncdist.get_default_backend_for_device("cpu") == tdist.get_default_backend_for_device("cpu") == "gloo"
    assert asyncdist.get_default_backend_for_device(torch.device("cuda", 1)) == "nccl"
    assert str(asyncdist.BackendConfig("cpu:gloo,cuda:nccl")) == "cpu:gloo,cuda:nccl"
    assert [m for m in asyncdist.DebugLevel.__members__] == [m for m in tdist.DebugLevel.__members__]
    for name in ("AllreduceOptions", "BroadcastOptions", "ReduceOptions", "BarrierOptions", "ScatterOptions"):
        theirs = {k for k in dir(getattr(tdist, name)()) if not k.startswith("_")}
        ours = {k for k in vars(getattr(asyncdist, name)())}
        assert ours == theirs, name
    assert asyncdist.supports_complex(asyncdist.ReduceOp.SUM) and not asyncdist.supports_complex(tdist.ReduceOp.MAX)
    with pytest.raises(asyncdist.errors.InvalidArgumentError, match="register third-party backends with torch"):
        asyncdist.Backend.register_backend("mine", lambda *args: None)


def new_names_at_work() -> dict:
    import asyncdist as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    out: dict = {"config": dist.get_backend_config(), "count": dist.get_pg_count()}
    rows = [[torch.zeros(2), torch.zeros(1, dtype=torch.int64)] for _ in range(2)]
    with dist.record_comm("coalesced"):
        dist.all_gather_coalesced(rows, [torch.full((2,), float(rank)), torch.tensor([10 + rank])])
    out["coalesced"] = [[t.tolist() for t in row] for row in rows]
    alone = dist.split_group(split_ranks=[[0], [1]])
    out["split"] = (dist.get_process_group_ranks(alone), dist.get_pg_count())
    dist.breakpoint(rank=-1)  # no rank breaks: a barrier
    dist.destroy_process_group()
    return out


def test_new_names_through_the_facade() -> None:
    results = spawn(2, new_names_at_work, timeout=60)
    for rank, out in enumerate(results):
        assert out["config"] == "cpu:gloo,cuda:gloo"
        assert out["count"] == 1
        assert out["coalesced"] == [[[0.0, 0.0], [10]], [[1.0, 1.0], [11]]]
        assert out["split"] == ([rank], 2)

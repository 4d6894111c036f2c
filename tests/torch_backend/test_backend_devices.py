"""Which devices the "asyncdist" backend serves: CPU and CUDA (CUDA through pinned
staging; tests/gpu/test_torch_backend_cuda.py runs it on a GPU), nothing else.
What a machine without a GPU can check: the registration torch reads, and the
group's answer to torch's per-device backend lookup."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from asyncdist.testing import spawn

torch = pytest.importorskip("torch")


def test_registered_for_cpu_and_cuda() -> None:
    import torch.distributed as tdist

    import asyncdist.torch_backend  # noqa: F401  (registers "asyncdist")

    assert tdist.Backend.backend_capability["asyncdist"] == ["cpu", "cuda"]


def _lookups(path: str) -> list[str]:
    import torch.distributed as tdist

    import asyncdist.torch_backend  # noqa: F401
    from asyncdist.errors import InvalidArgumentError

    tdist.init_process_group("asyncdist", init_method=f"file://{path}", rank=0, world_size=int(os.environ["WORLD_SIZE"]))
    try:
        group = tdist.group.WORLD
        answers = []
        for device in ("cpu", "cuda", "cuda:0", torch.device("cuda", 1)):
            answers.append("self" if group._get_backend(torch.device(device)) is group else "other")
        try:
            group._get_backend(torch.device("meta"))
        except InvalidArgumentError as exc:
            answers.append(str(exc))
        return answers
    finally:
        tdist.destroy_process_group()


def test_the_group_is_its_own_backend_for_cpu_and_cuda_only(tmp_path: Path) -> None:
    (answers,) = spawn(1, _lookups, str(tmp_path / "store"), timeout=60)
    assert answers == ["self"] * 4 + ["the asyncdist backend serves CPU and CUDA tensors, not meta"]

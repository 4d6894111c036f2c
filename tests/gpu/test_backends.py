"""Backend names (torch's spellings) and the paths they pick; GPU libraries stay unimported."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import asyncdist as dist
from asyncdist.facade.backends import parse_backend
from asyncdist.errors import InvalidArgumentError
from asyncdist.rendezvous.hash_store import HashStore
from asyncdist.testing.fake_device import FakeDevice


@pytest.mark.parametrize(
    "backend, cuda",
    [
        (None, "staging"),
        ("gloo", "staging"),
        ("GLOO", "staging"),
        ("asyncdist", "staging"),
        ("nccl", "nccl"),
        ("cuda:nccl", "nccl"),
        ("cpu:gloo,cuda:nccl", "nccl"),
        ("cpu:asyncdist, cuda:nccl", "nccl"),
        ("cpu:gloo,cuda:gloo", "staging"),
        ("cpu:gloo", "staging"),
    ],
)
def test_parse(backend, cuda):
    assert parse_backend(backend).cuda == cuda


@pytest.mark.parametrize("backend", ["mpi", "ucc", "cpu:nccl", "cuda:mpi", "cpu:gloo,cpu:gloo", "xla:gloo", "gloo,nccl"])
def test_unsupported_names(backend):
    with pytest.raises(InvalidArgumentError, match="not supported"):
        parse_backend(backend)
    with pytest.raises(InvalidArgumentError, match="not supported"):
        dist.init_process_group(backend, store=HashStore(), rank=0, world_size=1)
    assert not dist.is_initialized()


def test_nccl_world_and_groups(fake):
    dist.init_process_group("cpu:gloo,cuda:nccl", store=HashStore(), rank=0, world_size=1)
    try:
        world = dist.group.WORLD
        assert world.nccl is not None and dist.get_backend() == "cpu:gloo,cuda:nccl"
        inherited, staged = dist.new_group([0]), dist.new_group([0], backend="gloo")
        assert inherited.nccl is not None and staged.nccl is None
        dev = FakeDevice()
        x = dev.array(np.arange(4.0))
        dist.all_reduce(x, op=dist.ReduceOp.MAX)  # a one-rank NCCL communicator (fake)
        dist.all_reduce(x, group=staged)  # pinned staging
        host = np.arange(3)
        dist.all_reduce(host)  # host arrays of an NCCL world go over asyncdist's transport
        np.testing.assert_array_equal(dev.probe(x), np.arange(4.0))
        np.testing.assert_array_equal(host, np.arange(3))
    finally:
        dist.destroy_process_group()


def test_no_gpu_library_is_imported():
    """``import asyncdist`` and host operations import neither CuPy nor the device modules,
    and a torch CPU tensor is not taken for a device array."""
    code = textwrap.dedent(
        """
        import asyncio, importlib.util, sys
        import numpy as np
        import asyncdist
        from asyncdist.testing import local_world

        async def main():
            async with local_world(2) as ranks:
                xs = [np.ones(3) for _ in ranks]
                await asyncio.gather(*(g.all_reduce(x) for g, x in zip(ranks, xs)))
                assert xs[0].tolist() == [2.0, 2.0, 2.0]

        asyncio.run(main())
        banned = ["cupy", "asyncdist.gpu.torch_cuda", "asyncdist.gpu.cupy_cuda", "asyncdist.gpu.nccl"]
        assert not [m for m in banned if m in sys.modules], [m for m in banned if m in sys.modules]
        assert "torch" not in sys.modules
        if importlib.util.find_spec("torch") is not None:  # torch is optional
            import torch
            from asyncdist.gpu.device import adapter_for
            assert adapter_for(torch.zeros(1)) is None and adapter_for(torch.zeros(1, device="meta")) is None
            assert "asyncdist.gpu.torch_cuda" not in sys.modules
        print("ok")
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"

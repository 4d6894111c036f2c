"""Tests for asyncdist.buffers.contiguous: a contiguous stand-in for what is only
non-contiguous, and the layout refusals for what is not dense at all."""

from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest

from asyncdist._torch import torch_or_none
from asyncdist.buffers.contiguous import staged
from asyncdist.buffers.host import numpy_view
from asyncdist.errors import UnsupportedBufferError

torch = torch_or_none()
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

pytestmark = pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta:UserWarning")

SPARSE_COO = "has layout torch.sparse_coo; only dense tensors are supported (use .to_dense())"


def test_a_strided_array_is_copied_and_written_back() -> None:
    a = np.zeros((3, 4))
    column = a[:, 1]
    buf, write_back = staged(column, writable=True)
    numpy_view(buf)[:] = [1.0, 2.0, 3.0]
    write_back()
    assert a[:, 1].tolist() == [1.0, 2.0, 3.0]


@needs_torch
def test_a_strided_tensor_is_copied_and_written_back() -> None:
    t = torch.zeros(3, 4)
    buf, write_back = staged(t.t(), writable=True)
    numpy_view(buf, flat=True)[:] = np.arange(12.0)
    write_back()
    assert t.t().tolist() == np.arange(12.0).reshape(4, 3).tolist()


@needs_torch
@pytest.mark.parametrize("layout", ["sparse_coo", "sparse_csr"])
def test_a_sparse_tensor_gets_the_layout_refusal(layout: str) -> None:
    """Not torch's "unsupported memory format option Contiguous" from a
    ``.contiguous()`` tried on it: a sparse tensor's is_contiguous() is False."""
    t = torch.eye(3).to_sparse() if layout == "sparse_coo" else torch.eye(3).to_sparse_csr()
    with pytest.raises(UnsupportedBufferError, match=re.escape(f"has layout torch.{layout}; only dense tensors")):
        staged(t, writable=True)


@needs_torch
@pytest.mark.world_size(2)
async def test_a_collective_refuses_a_sparse_tensor(local_ranks) -> None:
    results = await asyncio.gather(
        *(g.all_reduce(torch.eye(3).to_sparse()) for g in local_ranks), return_exceptions=True
    )
    for error in results:
        assert isinstance(error, UnsupportedBufferError), error
        assert SPARSE_COO in str(error)

"""The tutorial examples for collectives run as scripts and print the right values.

Each script starts its own ranks with ``torch.multiprocessing`` (the
tutorial's template); the test gives it a free ``MASTER_PORT`` and checks
every rank's printed values against what the collective must produce.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from test_facade_processes import _run_ranks  # the same runner as the point-to-point examples

pytest.importorskip("torch")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(script: str) -> str:
    (out,) = _run_ranks(EXAMPLES / script, 1, extra_env={})
    return out


def test_tutorial_all_reduce_on_a_group_of_two() -> None:
    out = _run("tutorial_all_reduce_group.py")
    # Both ranks print concurrently, word by word: count each rank's last word.
    assert out.count("tensor(2.)") == 2 and "tensor(1.)" not in out


def test_tutorial_collectives_print_what_each_collective_must_give() -> None:
    lines = dict(re.findall(r"^(rank \d \w+): (.*)$", _run("tutorial_collectives.py"), re.M))
    n = 4
    for rank in range(n):
        expected = {
            "broadcast": [10.0],
            "reduce": [float(sum(range(1, n + 1)))] if rank == 0 else None,
            "all_reduce": [24.0],  # 1 * 2 * 3 * 4
            "scatter": [100.0 + rank],
            "gather": [float(r * r) for r in range(n)] if rank == 0 else None,
            "all_gather": [float(-r) for r in range(n)],
            "all_to_all": [10.0 * r + rank for r in range(n)],
        }
        for name, value in expected.items():
            assert lines[f"rank {rank} {name}"] == str(value), (rank, name)
    assert len(lines) == n * 7


def test_tutorial_ring_allreduce_agrees_with_all_reduce() -> None:
    out = _run("tutorial_ring_allreduce.py")
    total = [float(sum(r + 1 for r in range(4)) * i) for i in range(4)]  # arange(4) * (rank + 1), summed
    for rank in range(4):
        assert f"rank {rank}: ring {total} all_reduce {total} equal True" in out

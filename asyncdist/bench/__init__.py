"""asyncdist's benchmark: nccl-tests-style tables, against torch gloo if asked.

Run it as ``asyncdist-bench`` or ``python -m asyncdist.bench`` (see
``docs/benchmarks.md``). The package is laid out by concern:

* :mod:`~asyncdist.bench.plan` — what to measure (sizes, dtype, repetitions);
* :mod:`~asyncdist.bench.cases` — the registry of rows: what one call of each op does;
* :mod:`~asyncdist.bench.ddp` — the DDP training-step row's model and step;
* :mod:`~asyncdist.bench.loops` — the timing loops inside the rank processes;
* :mod:`~asyncdist.bench.runner` — rank processes per library; max over ranks, median over repetitions;
* :mod:`~asyncdist.bench.report` and :mod:`~asyncdist.bench.plot` — tables, json, plot;
* :mod:`~asyncdist.bench.floor` and :mod:`~asyncdist.bench.memcpy` — the machine's floors: one
  wake-up of another process, and the copy bandwidth that bounds large rows;
* :mod:`~asyncdist.bench.document` — the reference page, ``docs/benchmarks.md`` (``--report``);
* :mod:`~asyncdist.bench.calls` and :mod:`~asyncdist.bench.call_counter` — Python calls per
  operation, counted (``--count-calls``);
* :mod:`~asyncdist.bench.chaos`, :mod:`~asyncdist.bench.chaos_cluster`,
  :mod:`~asyncdist.bench.chaos_worker` and :mod:`~asyncdist.bench.chaos_model` — training
  while ranks are SIGKILLed and replaced (``--chaos``);
* :mod:`~asyncdist.bench.cli` — the command line.

Nothing here is imported by ``import asyncdist``.
"""

from __future__ import annotations

from .cli import main

__all__ = ["main"]

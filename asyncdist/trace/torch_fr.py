"""asyncdist's dumps as torch's flight-recorder dumps, for torch's analyzer.

torch 2.13's analyzer, ``python -m torch.distributed.flight_recorder.fr_trace
DIR``, reads one file per rank named ``<prefix><rank>``, each a pickled dict
with ``version``, ``pg_config`` and ``entries`` (what
``torch._C._distributed_c10d._dump_fr_trace()`` returns). It pairs each
group's n-th collective across ranks by ``collective_seq_id`` and reports the
ranks that did not join, or whose operation, sizes, dtypes or state differ.
:func:`torch_dumps` turns a :class:`~asyncdist.trace.load.Trace` into those
dicts and :func:`write_torch_dumps` writes them, so teams that read their
jobs with torch's tool read asyncdist's too.

What maps to what:

* a group is a ``pg_config`` entry keyed by its name, its ranks those of its
  collectives (global ranks); the world's description is ``default_pg``, as
  torch's default group's, the others' ``undefined``, as torch's groups'
  without a description;
* each collective is an entry: ``collective_seq_id`` is asyncdist's call
  number in its group (the same on every rank), ``profiling_name``
  ``gloo:<op>`` (the analyzer accepts only torch's backends' prefixes, and
  gloo is the CPU backend asyncdist stands in for), input and output sizes
  as torch records them for that op (an all_gather's output is every rank's
  input), dtypes by torch's names (``Float``);
* states: posted is ``scheduled``, started ``started``, completed
  ``completed``; torch's recorder has no failed state, so an operation that
  failed (a mismatch, a lost peer) is ``started``, which it was, and never
  completed. Its error is in asyncdist's own dump;
* ``record_id`` numbers the rank's exported entries from 0, so that the
  analyzer's alignment by record id keeps them all.

Left out: point-to-point operations (the analyzer pairs a send with a
receive only inside a coalesced batch; ``asyncdist-trace analyze`` reports
them), and internal operations torch has no name for. Their absence moves no
call number, so the collectives still pair up.

The files are pickles because that is the format torch's analyzer reads;
this module writes them and never reads one.
"""

from __future__ import annotations

import math
import pickle
from pathlib import Path
from typing import Any

from .load import Dump, Trace

__all__ = ["FR_PREFIX", "FR_VERSION", "torch_dumps", "write_torch_dumps"]

#: The file name of rank R's dump is ``FR_PREFIX + str(R)`` (``--prefix`` for fr_trace).
FR_PREFIX = "torch-fr-rank"
#: The dump format version torch 2.13's recorder writes (and its analyzer checks across ranks).
FR_VERSION = "2.10"

_STATES = {"posted": "scheduled", "started": "started", "completed": "completed", "failed": "started"}

_DTYPES = {
    "float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16", "int64": "Long",
    "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte", "bool": "Bool",
    "complex64": "ComplexFloat", "complex128": "ComplexDouble",
}  # fmt: skip


def _sizes(op: str, shape: list[int] | None, n: int) -> tuple[str, list[list[int]], list[list[int]]] | None:
    """(torch's op name, input sizes, output sizes) of asyncdist's ``op`` on a group of ``n``,
    as torch records them; None for an op torch has no name for."""
    one = [] if shape is None else [list(shape)]
    whole = [[n * shape[0], *shape[1:]] if shape else [n]] if shape is not None else []
    if op in ("all_reduce", "broadcast", "reduce"):
        return op, one, one
    if op == "all_reduce_coalesced":  # its tensors packed end to end: the shape is the packed buffer's
        return "all_reduce", one, one
    if op in ("all_gather", "all_gather_into_tensor", "all_gather_into_tensor_coalesced"):
        return "all_gather", one, whole  # gloo names both all_gather; its output holds every rank's input
    if op in ("reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced"):
        return "reduce_scatter", whole, one  # the shape is each rank's part
    if op == "gather":
        return "gather", one, []  # the analyzer compares no gather outputs (only the root has them)
    if op == "scatter":
        return "scatter", [], one  # nor scatter inputs
    if op in ("all_to_all", "all_to_all_single"):
        return "all_to_all", [], []  # no shape is recorded: sizes differ by rank
    if op in ("barrier", "monitored_barrier"):
        return "barrier", [], []
    return None


def _entry(dump: Dump, record: dict[str, Any], desc: str) -> dict[str, Any] | None:
    """A collective's record as torch's entry (its ``record_id`` still to be set), or None."""
    described = record["described"]
    mapped = _sizes(described["op"], described["shape"], len(record["peers"]))
    if mapped is None:
        return None
    op, inputs, outputs = mapped
    dtype = _DTYPES.get(described["dtype"] or "", described["dtype"] or "")
    state = _STATES[record["state"]]

    def wall_ns(clock: float | None) -> int | None:
        return None if clock is None else math.floor(dump.wall(clock) * 1e9)

    return {
        "pg_id": record["ctx"], "process_group": (record["group"], desc),
        "collective_seq_id": record["seq"], "p2p_seq_id": 0, "op_id": record["seq"], "is_p2p": False,
        "profiling_name": f"gloo:{op}", "time_created_ns": wall_ns(record["posted"]),
        "input_sizes": inputs, "input_dtypes": [dtype] * len(inputs),
        "output_sizes": outputs, "output_dtypes": [dtype] * len(outputs),
        "state": state, "retired": record["state"] in ("completed", "failed"), "timeout_ms": None,
        "time_discovered_started_ns": wall_ns(record["started"]),
        "time_discovered_completed_ns": wall_ns(record["ended"]) if state == "completed" else None,
        "frames": [],
    }  # fmt: skip


#: The names of the group torch calls its default one: the facade's world and
#: the torch backend's group for torch's default group (torch names it "0").
_DEFAULT_GROUPS = ("world", "torch:0")


def _description(group: str) -> str:
    """torch's description of a group: ``default_pg``, or ``undefined`` (torch's when none was given)."""
    return "default_pg" if group in _DEFAULT_GROUPS else "undefined"


def torch_dumps(trace: Trace) -> dict[int, dict[str, Any]]:
    """Each rank's dump in torch's flight-recorder format, by global rank.

    Example::

        from asyncdist.trace.load import load
        dumps = torch_dumps(load("/tmp/traces"))
        dumps[0]["entries"][0]["profiling_name"]   # 'gloo:barrier'
    """
    out = {}
    for rank, dump in trace.dumps.items():
        collectives = [record for record in dump.entries if record["kind"] == "collective"]
        mapped = [_entry(dump, record, _description(record["group"])) for record in collectives]
        entries = [{"record_id": i, **entry} for i, entry in enumerate(e for e in mapped if e is not None)]
        groups = {record["group"]: record["peers"] for record in collectives}
        out[rank] = {
            "version": FR_VERSION, "comm_lib_version": "", "pg_status": {}, "entries": entries,
            "pg_config": {name: {"name": name, "desc": _description(name), "ranks": str(sorted(ranks))}
                          for name, ranks in groups.items()},
        }  # fmt: skip
    return out


def write_torch_dumps(trace: Trace, folder: str | Path) -> list[Path]:
    """Write :func:`torch_dumps` into ``folder``, one ``torch-fr-rank<R>`` per rank; return the paths.

    Read them with ``python -m torch.distributed.flight_recorder.fr_trace FOLDER --prefix torch-fr-rank``.
    """
    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank, dump in sorted(torch_dumps(trace).items()):
        path = target / f"{FR_PREFIX}{rank}"
        path.write_bytes(pickle.dumps(dump))
        paths.append(path)
    return paths

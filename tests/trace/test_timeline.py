"""``asyncdist-trace timeline``: the trace-event JSON a browser's trace viewer opens."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from asyncdist.testing import local_world
from asyncdist.trace.cli import main
from asyncdist.trace.load import load

_REQUIRED = {"B": {"name", "ph", "ts", "pid", "tid"}, "E": {"ph", "ts", "pid", "tid"},
             "s": {"name", "ph", "ts", "pid", "tid", "id"}, "f": {"name", "ph", "ts", "pid", "tid", "id"},
             "M": {"name", "ph", "pid", "args"}}


async def _job(folder: Path) -> None:
    """Collectives, blocking p2p, and isend/irecv that overlap an all_reduce."""
    async with local_world(2) as ranks:
        a, b = ranks
        x = [np.ones(4, np.float32), np.ones(4, np.float32)]
        await asyncio.gather(a.all_reduce(x[0]), b.all_reduce(x[1]))
        out = np.zeros(8)
        await asyncio.gather(a.send(np.arange(8.0), dst=1, tag=5), b.recv(out, src=0, tag=5))
        sent, got = a.isend(np.ones(3), dst=1, tag=6), b.irecv(np.zeros(3), src=0, tag=6)
        await asyncio.gather(a.all_reduce(x[0]), b.all_reduce(x[1]))
        await asyncio.gather(sent, got)
        np.testing.assert_array_equal(out, np.arange(8.0))
        for group in ranks:
            group.dump_trace(folder)


async def test_the_timeline_is_well_formed_trace_event_json(tmp_path: Path) -> None:
    await _job(tmp_path)
    output = tmp_path / "trace.json"
    assert main(["timeline", str(tmp_path), "-o", str(output)]) == 0
    events = json.loads(output.read_text())["traceEvents"]

    stacks: dict[tuple, list] = defaultdict(list)
    last_ts: dict[tuple, float] = {}
    flows: dict[int, list] = defaultdict(list)
    for event in events:
        assert _REQUIRED[event["ph"]] <= set(event), event
        if event["ph"] == "M":
            continue
        track = (event["pid"], event["tid"])
        assert isinstance(event["ts"], (int, float)) and event["ts"] >= last_ts.get(track, 0.0), event
        last_ts[track] = event["ts"]
        if event["ph"] == "B":
            stacks[track].append(event)
        elif event["ph"] == "E":
            assert stacks[track], f"an end without a begin: {event}"
            assert stacks[track].pop()["name"] == event["name"]
        else:
            assert stacks[track], f"a flow event outside a slice: {event}"
            flows[event["id"]].append(event)
    assert not any(stacks.values()), "a begin without an end"
    metadata = {(e["name"], e["pid"], e["tid"]): e["args"] for e in events if e["ph"] == "M"}
    for track in last_ts:  # every track named, every rank's tracks ordered by rank
        assert metadata[("thread_name", track[0], track[1])]["name"].startswith("ops")
        assert metadata[("process_sort_index", track[0], 0)] == {"sort_index": track[0]}
        assert metadata[("process_name", track[0], 0)] == {"name": f"rank {track[0]}"}

    trace = load(tmp_path)
    begins = [e for e in events if e["ph"] == "B"]
    for rank, dump in trace.dumps.items():  # one span per recorded operation
        assert sorted(e["args"]["desc"] for e in begins if e["pid"] == rank) == sorted(
            entry["desc"] for entry in dump.entries)
    reduces = [e for e in begins if e["name"] == "all_reduce"]
    assert len(reduces) == 4 and all(e["args"]["bytes"] == 16 for e in reduces)
    assert sorted(e["args"]["bytes"] for e in begins if e["name"] == "send") == [24, 64]
    # One arrow per message, from the sender (rank 0) to the receiver (rank 1).
    assert len(flows) == 2
    for pair in flows.values():
        assert [(e["ph"], e["pid"]) for e in pair] == [("s", 0), ("f", 1)]

"""A job's flight records as a Chrome/Perfetto trace (the trace-event JSON format).

One process track per rank ("rank 3"); each operation is a begin/end pair
(``ph`` "B"/"E") named by its op, with its description, call number,
group, bytes and state in ``args``. Operations of one rank may overlap (an
``isend`` under a collective), and begin/end pairs on one thread must nest,
so each rank's operations are laid out on as few lanes (``tid``) as keep
every lane free of overlaps. Each point-to-point message is a flow arrow
(``ph`` "s" to "f") from its send to the receive that took it, matched per
(group, source, destination, tag) in order, as the engine matches them.

Times are microseconds of wall-clock time from the earliest operation; an
operation still open when its rank dumped ends at the dump.

Format: https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from .analyze import described
from .load import Trace

__all__ = ["timeline"]


def _spans(trace: Trace) -> list[dict[str, Any]]:
    """Every operation as {rank, start, end, entry} in wall-clock seconds."""
    spans = []
    for rank, dump in trace.dumps.items():
        for entry in dump.entries:
            end = entry["ended"] if entry["ended"] is not None else dump.data["clock_time"]
            start = entry["started"] if entry["started"] is not None else entry["posted"]
            spans.append({"rank": rank, "start": dump.wall(start), "end": dump.wall(max(end, start)), "entry": entry})
    return spans


def _lanes(spans: list[dict[str, Any]]) -> None:
    """Give each span a lane of its rank on which no two spans overlap (sets "lane")."""
    ends: dict[int, list[float]] = defaultdict(list)  # rank -> each lane's last end
    for span in sorted(spans, key=lambda s: (s["start"], s["end"])):
        lanes = ends[span["rank"]]
        lane = next((i for i, end in enumerate(lanes) if end <= span["start"]), len(lanes))
        if lane == len(lanes):
            lanes.append(0.0)
        lanes[lane] = span["end"]
        span["lane"] = lane


def _args(entry: dict[str, Any]) -> dict[str, Any]:
    nbytes = entry["nbytes"] if entry["nbytes"] >= 0 else described(entry).nbytes
    return {"desc": entry["desc"], "group": entry["group"], "call": entry["seq"], "state": entry["state"],
            "bytes": nbytes, "peers": entry["peers"], "error": entry.get("error")}


def _flows(spans: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(send span, receive span) of each point-to-point message, matched in order."""
    sends: dict[tuple, list] = defaultdict(list)
    recvs: dict[tuple, list] = defaultdict(list)
    for span in sorted(spans, key=lambda s: s["entry"]["serial"]):
        entry = span["entry"]
        message = described(entry)
        if not message.is_message or len(entry["peers"]) != 1:
            continue
        peer = entry["peers"][0]
        if message.op == "send":
            sends[(entry["group"], span["rank"], peer, message.tag)].append(span)
        elif entry["state"] == "completed":
            recvs[(entry["group"], peer, span["rank"], message.tag)].append(span)
    return [pair for key, out in sends.items() for pair in zip(out, recvs.get(key, []))]


def timeline(trace: Trace) -> dict[str, Any]:
    """The trace-event JSON object of a job's dumps (``{"traceEvents": [...]}``)."""
    spans = _spans(trace)
    _lanes(spans)
    origin = min((s["start"] for s in spans), default=0.0)

    def us(seconds: float) -> float:
        return round((seconds - origin) * 1e6, 3)

    timed: list[tuple[tuple, dict[str, Any]]] = []  # (sort key, event)
    for span in spans:
        entry, rank, lane = span["entry"], span["rank"], span["lane"]
        name = described(entry).op
        begin = {"name": name, "cat": entry.get("kind", "collective"), "ph": "B", "ts": us(span["start"]),
                 "pid": rank, "tid": lane, "args": _args(entry)}
        end = {"name": name, "cat": begin["cat"], "ph": "E", "ts": us(span["end"]), "pid": rank, "tid": lane}
        timed += [((rank, lane, begin["ts"], 1), begin), ((rank, lane, end["ts"], 0), end)]
    for number, (send, recv) in enumerate(_flows(spans)):
        start = {"name": "message", "cat": "p2p", "ph": "s", "id": number, "ts": us(send["start"]),
                 "pid": send["rank"], "tid": send["lane"]}
        finish = {"name": "message", "cat": "p2p", "ph": "f", "bp": "e", "id": number, "ts": us(recv["end"]),
                  "pid": recv["rank"], "tid": recv["lane"]}
        timed += [((send["rank"], send["lane"], start["ts"], 2), start),
                  ((recv["rank"], recv["lane"], finish["ts"], -1), finish)]
    timed.sort(key=lambda item: item[0])
    # Metadata, so that viewers name the tracks "rank r" / "ops" and order them by rank.
    names = [{"name": key, "ph": "M", "pid": rank, "tid": 0, "args": value}
             for rank in sorted(trace.dumps)
             for key, value in (("process_name", {"name": f"rank {rank}"}), ("process_sort_index", {"sort_index": rank}))]
    names += [{"name": "thread_name", "ph": "M", "pid": rank, "tid": lane,
               "args": {"name": "ops" if lane == 0 else f"ops, overlapping ({lane})"}}
              for rank, lane in sorted({(span["rank"], span["lane"]) for span in spans})]
    return {"traceEvents": names + [event for _, event in timed], "displayTimeUnit": "ms"}

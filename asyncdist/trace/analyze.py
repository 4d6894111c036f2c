"""What went wrong, from every rank's flight record, in plain words.

Three questions, each answered from the dumps alone:

* **which rank died**: a rank that the survivors report lost (or that left
  no dump), and for each survivor what it was waiting in, and for whom;
* **which ranks disagree**: a call number of a group that ranks entered
  with different descriptions (another op, size, root or dtype);
* **which rank is behind**: ranks that wait in call #N of a group while
  another rank's latest call of that group is below N, or in another call;
  and, from the stacks in its dump (or in its answer to a hang warning),
  where its user's thread is: the innermost frame of the user's code, and
  the asyncdist call it is in, if any.

The findings come out most telling first: a death explains everything
after it, a disagreement explains the hang that follows it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from ..flight.descriptions import Description, short
from ..flight.stacks import Location, locate, where_text
from .load import Trace

__all__ = ["Finding", "analyze", "as_text", "location"]

_WAITING_ERRORS = ("OperationTimeoutError", "PeerLostError")


@dataclass
class Finding:
    """One thing that went wrong.

    Attributes:
        kind: "died", "waiting", "mismatch", "behind" or "ok".
        text: the sentence that says it.
        ranks: the ranks it is about (the dead, the disagreeing, the one behind).
        group, call: the group and call number, where it is about one call.
        details: anything else, for tools (``--json``).
    """

    kind: str
    text: str
    ranks: list[int] = field(default_factory=list)
    group: str | None = None
    call: int | None = None
    details: dict[str, Any] = field(default_factory=dict)


def _waiting(entry: dict[str, Any]) -> bool:
    """An entry that was waiting when the dump was written (or failed while it waited)."""
    if entry["state"] in ("posted", "started"):
        return True
    return entry["state"] == "failed" and (entry.get("error") or "").startswith(_WAITING_ERRORS)


def _name(ranks: list[int]) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"


def described(entry: dict[str, Any]) -> Description:
    """A dumped record's description, in parts."""
    return Description.from_dict(entry["described"], entry["desc"])


def _where(entry: dict[str, Any]) -> str:
    return short(described(entry), entry["seq"], entry["group"])


def _awaited(entry: dict[str, Any], rank: int) -> list[int]:
    awaited = entry.get("awaited")
    if awaited and (awaited.get("receiving") or awaited.get("sending")):
        return sorted(set(awaited.get("receiving", [])) | set(awaited.get("sending", [])))
    return [peer for peer in entry["peers"] if peer != rank]


def _deaths(trace: Trace) -> list[Finding]:
    reports: dict[int, str] = {}
    for dump in trace.dumps.values():
        for rank, why in dump.data.get("lost", {}).items():
            reports.setdefault(int(rank), why)
    dead = sorted(set(reports) - set(trace.dumps))
    findings = [
        Finding("died", f"rank {rank} died: {reports[rank]}", [rank], details={"report": reports[rank]})
        for rank in dead
    ]
    findings += [
        Finding("died", f"rank {rank} left no dump (it died, or could not write one)", [rank])
        for rank in trace.missing if rank not in reports
    ]  # fmt: skip
    return findings


def _survivors_waiting(trace: Trace, dead: set[int]) -> list[Finding]:
    findings = []
    for rank, dump in sorted(trace.dumps.items()):
        for entry in dump.entries:
            if not _waiting(entry):
                continue
            peers = _awaited(entry, rank)
            if dead and not dead & set(peers) and not dead & set(entry["peers"]):
                continue
            text = f"rank {rank} was waiting in {_where(entry)} ({entry['desc']}) for {_name(peers)}"
            if entry.get("error"):
                text += f"; it failed: {entry['error']}"
            findings.append(Finding("waiting", text, [rank], entry["group"], entry["seq"],
                                    {"waiting_for": peers, "desc": entry["desc"], "error": entry.get("error")}))
    return findings


def _calls(trace: Trace) -> dict[str, dict[int, dict[int, dict[str, Any]]]]:
    """group -> call number -> rank -> that rank's entry of the call."""
    calls: dict[str, dict[int, dict[int, dict[str, Any]]]] = defaultdict(lambda: defaultdict(dict))
    for rank, dump in trace.dumps.items():
        for entry in dump.entries:
            if entry.get("kind", "collective") == "collective":
                calls[entry["group"]][entry["seq"]][rank] = entry
    return calls


def _differences(parts: list[Description]) -> list[str]:
    words = {"op": "op", "nbytes": "size", "shape": "size", "root": "root", "dtype": "dtype", "reduce": "reduction"}
    found = [word for attr, word in words.items() if len({getattr(p, attr) for p in parts}) > 1]
    return list(dict.fromkeys(found))


def _mismatches(trace: Trace) -> list[Finding]:
    findings = []
    for group, calls in sorted(_calls(trace).items()):
        for seq, by_rank in sorted(calls.items()):
            ranks_of: dict[str, list[int]] = defaultdict(list)
            parts: dict[str, Description] = {}
            for rank, entry in sorted(by_rank.items()):
                ranks_of[entry["desc"]].append(rank)
                parts[entry["desc"]] = described(entry)
            if len(ranks_of) < 2:
                continue
            differ = _differences(list(parts.values()))
            entered = "; ".join(f"{_name(ranks)} entered {desc}" for desc, ranks in ranks_of.items())
            text = f"ranks disagree in call #{seq} of group {group} (different {', '.join(differ)}): {entered}"
            findings.append(Finding("mismatch", text, sorted(by_rank), group, seq,
                                    {"entered": dict(ranks_of), "differ": differ}))
    return findings


def _heard(trace: Trace, group: str) -> dict[int, dict[str, Any]]:
    """What ranks that left no dump answered the survivors' hang questions about ``group``."""
    heard: dict[int, dict[str, Any]] = {}
    for dump in trace.dumps.values():
        for rank, answer in dump.data.get("heard", {}).items():
            if int(rank) not in trace.dumps and answer.get("group") == group and answer.get("kind") == "collective":
                heard[int(rank)] = {**answer, "heard_by": dump.rank}
    return heard


def location(trace: Trace, rank: int, heard: dict[str, Any] | None = None) -> Location | None:
    """Where ``rank``'s user's thread is: from its dump's latest stack capture,
    else from ``heard`` (its answer to a hang warning); None if neither tells."""
    dump = trace.dumps.get(rank)
    captures = dump.stacks if dump is not None else None
    if captures:
        return locate(captures[-1])
    stack = (heard or {}).get("stack")
    return locate(stack) if isinstance(stack, dict) else None


def _behind(trace: Trace) -> list[Finding]:
    findings = []
    for group, calls in sorted(_calls(trace).items()):
        latest: dict[int, dict[str, Any]] = {}
        for seq in sorted(calls):
            for rank, entry in calls[seq].items():
                latest[rank] = entry
        waiting = {rank: entry for rank, entry in latest.items() if _waiting(entry)}
        if not waiting:
            continue
        latest.update(_heard(trace, group))
        call = max(entry["seq"] for entry in waiting.values())
        members = set(next(iter(waiting.values()))["peers"]) & (set(trace.dumps) | set(latest))
        behind = sorted(rank for rank in members if rank not in latest or latest[rank]["seq"] < call)
        if not behind:
            continue
        waiters = sorted(rank for rank, entry in waiting.items() if entry["seq"] == call)
        entry = waiting[waiters[0]]
        for rank in behind:
            mine = latest.get(rank)
            at = "has no call of it in its record" if mine is None else \
                f"is at {_where(mine)} ({mine['desc']}, {mine['state']})"
            if mine is not None and "heard_by" in mine:
                at += f" as it told rank {mine['heard_by']}'s hang warning (it left no dump)"
            text = (f"rank {rank} is behind on group {group}: it {at}, while {_name(waiters)} "
                    f"wait in call #{call} ({entry['desc']})")
            where = location(trace, rank, mine)
            if where is not None:
                text += f"; rank {rank}'s {where_text(where)}"
            findings.append(Finding("behind", text, [rank], group, call, {
                "its_call": None if mine is None else mine["seq"], "waiting": waiters, "desc": entry["desc"],
                "stack": None if where is None else where.as_dict()}))
    return findings


def analyze(trace: Trace) -> list[Finding]:
    """The findings of a job's dumps, most telling first (an "ok" one if nothing is wrong)."""
    deaths = _deaths(trace)
    dead = {rank for finding in deaths for rank in finding.ranks}
    findings = deaths + _mismatches(trace) + _behind(trace)
    if dead or findings:
        findings += _survivors_waiting(trace, dead)
    if not findings:
        latest = {rank: max((e["serial"] for e in d.entries), default=-1) for rank, d in trace.dumps.items()}
        findings.append(Finding("ok", f"no rank is behind, none disagrees and none died "
                                      f"({len(trace.dumps)} of {trace.world_size} ranks dumped)",
                                details={"latest": latest}))
    return findings


def as_text(trace: Trace, findings: list[Finding]) -> str:
    """The findings as the command prints them."""
    header = f"{len(trace.dumps)} of {trace.world_size} ranks dumped"
    if trace.missing:
        header += f" (none from {_name(trace.missing)})"
    return "\n".join([header + ":", *(f"- {finding.text}" for finding in findings)])


def as_json(trace: Trace, findings: list[Finding]) -> dict[str, Any]:
    """The findings for tools."""
    return {"world_size": trace.world_size, "ranks": sorted(trace.dumps), "missing": trace.missing,
            "findings": [asdict(finding) for finding in findings]}

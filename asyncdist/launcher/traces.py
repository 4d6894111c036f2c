"""Where a launched job's flight-recorder dumps go, and what they say after a failure.

Each worker is given ``ASYNCDIST_TRACE_DIR`` (unless the user set it): the
attempt's ``trace`` folder beside its logs (``LOG_DIR/RUN_ID/attempt_N/trace``,
or under the system's temporary folder without ``--log-dir``). Ranks write
there only when something fails (:mod:`asyncdist.flight.dumps`), so the
folder exists only then; after a failed attempt the launcher says where the
dumps are and names the cause that their analysis (:mod:`asyncdist.trace`)
finds.

Why the analysis and not the order of exits: the first rank to exit is often
a victim. A rank stuck in user code never fails; its peers time out waiting
for it and exit first. The dumps of those peers say whom they waited for,
and where that rank was. So the cause named is a rank the survivors report
dead (the first to fail, if several are), else ranks that disagree about a
call, else the rank that is behind, with its last call; the launcher's
summary names the first worker to fail after it.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from ..flight.dumps import TRACE_DIR_ENV
from ..trace.analyze import Finding, analyze
from ..trace.load import load

__all__ = ["TRACE_DIR_ENV", "attempt_folder", "report", "cause"]

_DUMPS = "asyncdist-trace-rank*.json"
# What explains a failure, most telling first (the analysis's own order):
# a death explains what follows it, a disagreement the hang after it.
_CAUSES = ("died", "mismatch", "behind")


def attempt_folder(log_dir: str | None, job_id: str | None, restart_count: int) -> Path:
    """The folder of attempt ``restart_count``'s dumps (not created here)."""
    base = Path(log_dir) if log_dir else Path(tempfile.gettempdir()) / "asyncdist-run"
    return base / (job_id or "none") / f"attempt_{restart_count}" / "trace"


def report(folder: str | Path, first_failed: int | None = None) -> str | None:
    """After a failed attempt: say where the ranks' dumps are, if any rank
    wrote one, and what their analysis names as the cause (blocking).

    Args:
        folder: the attempt's dump folder.
        first_failed: the global rank of the worker that failed first, by
            the launcher's watch of the exits (None: a replacement, whose rank
            the launcher does not know); among several dead ranks, it is the
            one named.

    Returns:
        The cause (see :func:`cause`), or None: no dumps, or none names one.
    """
    dumps = sorted(Path(folder).glob(_DUMPS))
    if not dumps:
        return None
    print(f"asyncdist-run: {len(dumps)} ranks' flight-recorder dumps are in {folder}; "
          f"read them with: asyncdist-trace analyze {folder}", file=sys.stderr, flush=True)
    try:
        findings = analyze(load(folder))
    except Exception as exc:  # a best effort: a dump cut short by a kill must not stop the launcher's report
        print(f"asyncdist-run: the dumps could not be analyzed: {type(exc).__name__}: {exc}", file=sys.stderr,
              flush=True)
        return None
    return cause(findings, first_failed)


def cause(findings: list[Finding], first_failed: int | None = None) -> str | None:
    """The finding that explains the failure, as the launcher's summary words it.

    A rank that the survivors report dead (``first_failed`` if it is one of
    them, else the first), else ranks that disagree about a call, else the
    rank that is behind (the finding says where it is). A rank that only
    left no dump is no cause: the launcher's own SIGTERM leaves that too.

    Returns:
        The finding's sentence (a dead rank's with the call its survivors
        waited for it in, if they did), or None when no finding names one.
    """
    for kind in _CAUSES:
        named = [f for f in findings if f.kind == kind and (kind != "died" or "report" in f.details)]
        if not named:
            continue
        finding = next((f for f in named if f.ranks == [first_failed]), named[0])
        if kind != "died":
            return finding.text
        dead = finding.ranks[0]
        waited = [f for f in findings if f.kind == "waiting" and dead in f.details.get("waiting_for", ())]
        if not waited:
            return finding.text
        return (f"{finding.text}; {_name(sorted({r for f in waited for r in f.ranks}))} waited for it in call "
                f"#{waited[0].call} of group {waited[0].group} ({waited[0].details.get('desc')})")
    return None


def _name(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"

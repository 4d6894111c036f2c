"""Where a launched job's flight-recorder dumps go, and telling the user after a failure.

Each worker is given ``ASYNCDIST_TRACE_DIR`` (unless the user set it): the
attempt's ``trace`` folder beside its logs (``LOG_DIR/RUN_ID/attempt_N/trace``,
or under the system's temporary folder without ``--log-dir``). Ranks write
there only when something fails (:mod:`asyncdist.flight.dumps`), so the
folder exists only then; after a failed attempt the launcher says where the
dumps are and how to read them.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from ..flight.dumps import TRACE_DIR_ENV

__all__ = ["TRACE_DIR_ENV", "attempt_folder", "report"]


def attempt_folder(log_dir: str | None, job_id: str | None, restart_count: int) -> Path:
    """The folder of attempt ``restart_count``'s dumps (not created here)."""
    base = Path(log_dir) if log_dir else Path(tempfile.gettempdir()) / "asyncdist-run"
    return base / (job_id or "none") / f"attempt_{restart_count}" / "trace"


def report(folder: str | Path) -> None:
    """After a failed attempt: say where the ranks' dumps are, if any rank wrote one."""
    dumps = sorted(Path(folder).glob("asyncdist-trace-rank*.json"))
    if dumps:
        print(f"asyncdist-run: {len(dumps)} ranks' flight-recorder dumps are in {folder}; "
              f"read them with: asyncdist-trace analyze {folder}", file=sys.stderr, flush=True)

"""The machinery behind ``asyncdist-run`` (:mod:`asyncdist.run`) and ``asyncdist.launch``.

* :mod:`.args` — the command line, torchrun's flags, into a :class:`LaunchConfig`;
* :mod:`.job` — the job's store (served on node 0), identity, and each worker's
  environment and command line;
* :mod:`.supervisor` — the worker processes: start, relay output, stop on
  failure or signal, restart.

Nothing here is imported by ``import asyncdist``; the launcher's own process
never joins the job.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from .args import LaunchConfig
from .job import Job, LaunchError
from .supervisor import FAILURE_EXIT_CODE, run_job

__all__ = ["LaunchConfig", "Job", "LaunchError", "run_job", "FAILURE_EXIT_CODE", "launch"]


def launch(config: LaunchConfig) -> int:
    """Run one node's share of a job to the end; return the launcher's exit code (blocking).

    Main thread only (it handles SIGINT, SIGTERM and SIGHUP while it runs).
    """
    try:
        job = Job(config)
    except LaunchError as exc:
        print(f"asyncdist-run: error: {exc}", file=sys.stderr, flush=True)
        return FAILURE_EXIT_CODE
    except KeyboardInterrupt:  # while waiting for node 0's store: no worker runs yet
        return 128 + signal.SIGINT
    try:
        code = asyncio.run(run_job(job))
        if code == 0:
            job.finish()
        return code
    except LaunchError as exc:
        print(f"asyncdist-run: error: {exc}", file=sys.stderr, flush=True)
        return FAILURE_EXIT_CODE
    except KeyboardInterrupt:  # in the exit barrier: the workers are done already
        return 128 + signal.SIGINT
    finally:
        job.close()

"""A rank started by hand, as from its own shell: ``python init_main.py [SECONDS]``.

It joins with ``dist.init_process_group()`` (env://: MASTER_ADDR, MASTER_PORT,
RANK, WORLD_SIZE from the environment) with a timeout of SECONDS (default
20), all_reduces its rank, and prints one JSON line: ``{"sum": ...}``, or
``{"error": class name, "message": ...}`` if init or the all_reduce raised.
It exits 0 either way; stderr is left to what asyncdist logs. With
``HOLD_FILE`` set it prints ``{"joined": true}`` once joined and stays in
the job until the test removes that file.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta

import numpy as np

import asyncdist as dist


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 20.0
    try:
        dist.init_process_group(timeout=timedelta(seconds=seconds))
        x = np.array([float(dist.get_rank())])
        dist.all_reduce(x)
        hold = os.environ.get("HOLD_FILE")
        if hold:  # stay in the job until the test removes the file; rank 0 decides for all
            print(json.dumps({"joined": True}), flush=True)
            while True:
                flag = np.array([float(os.path.exists(hold))])
                dist.broadcast(flag, 0)
                if not flag[0]:
                    break
                time.sleep(0.05)  # pacing, not synchronisation: the broadcast is that
        dist.destroy_process_group()
        print(json.dumps({"sum": float(x[0]), "pid": os.getpid()}), flush=True)
    except Exception as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc), "pid": os.getpid()}), flush=True)


if __name__ == "__main__":
    main()

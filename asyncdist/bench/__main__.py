"""``python -m asyncdist.bench``: the same as ``asyncdist-bench``."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m asyncdist.bench"))

"""``python -m asyncdist.trace``: the same as ``asyncdist-trace``."""

from .cli import main

raise SystemExit(main())

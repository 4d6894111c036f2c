"""``python -m asyncdist.configuration``: print docs/configuration.md's tables of variables.

They are :func:`asyncdist.settings.markdown`, made from the declarations in
:mod:`asyncdist.settings`; a test checks that the page holds them. A module
of its own because ``python -m`` of a module that the package itself
imports (``asyncdist.settings``) would run it twice.
"""

from __future__ import annotations

import sys

from .settings import markdown

if __name__ == "__main__":
    if sys.argv[1:]:
        sys.exit("usage: python -m asyncdist.configuration")
    sys.stdout.write(markdown())

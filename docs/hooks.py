"""mkdocs hook: show Sphinx cross-reference roles from the docstrings as code.

The docstrings name other objects the Sphinx way (:class:`~asyncdist.group.work.Work`);
mkdocstrings renders them verbatim, so this hook turns each into its code span
(``Work``: the last dotted part where the name starts with "~", as Sphinx does).
"""

from __future__ import annotations

import re

_ROLE = re.compile(r":(?:func|class|meth|mod|attr|exc|data|obj|const):<code>(~?)([^<]*)</code>")


def _name(match: re.Match[str]) -> str:
    tilde, target = match.group(1), match.group(2)
    return f"<code>{target.rsplit('.', 1)[-1] if tilde else target}</code>"


def on_page_content(html: str, **kwargs: object) -> str:
    return _ROLE.sub(_name, html)

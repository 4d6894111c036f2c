"""docs/configuration.md's tables list exactly the environment variables the code reads.

A variable is a string literal in asyncdist/ that is spelled like one of the
families below (asyncdist's own, torch's, the launchers'). Those that asyncdist
only *sets* for the processes it starts (the launcher's torchrun variables)
are listed under "Set by the launchers" and need no row.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "configuration.md"

_FAMILY = re.compile(r"^(ASYNCDIST|TORCHELASTIC|TORCH|MASTER|OMPI|PMI|MPI|SLURM|LOCAL)_[A-Z0-9_]+$|^(RANK|WORLD_SIZE)$")
# Set for the workers, never read: documented in the section "Set by the launchers".
SET_ONLY = {"TORCHELASTIC_MAX_RESTARTS"}


def variables_in_code() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in sorted((ROOT / "asyncdist").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _FAMILY.match(node.value):
                found.setdefault(node.value, path.relative_to(ROOT))
            elif isinstance(node, ast.keyword) and node.arg and _FAMILY.match(node.arg):
                found.setdefault(node.arg, path.relative_to(ROOT))  # dict(RANK=...) sets, is not read
    return found


def variables_in_tables() -> set[str]:
    rows = [line for line in PAGE.read_text().splitlines() if line.startswith("| `")]
    names: set[str] = set()
    for row in rows:
        first_cell = row.split("|")[1]
        names.update(re.findall(r"`([A-Z][A-Z0-9_]+)`", first_cell))
    return names


def test_every_variable_the_code_reads_has_a_row() -> None:
    table = variables_in_tables()
    missing = {name: str(path) for name, path in variables_in_code().items()
               if name not in table and name not in SET_ONLY and not _only_set(name)}
    assert not missing, f"docs/configuration.md lacks rows for {missing}"


def test_every_row_names_a_variable_the_code_knows() -> None:
    stale = variables_in_tables() - set(variables_in_code())
    assert not stale, f"docs/configuration.md lists variables the code no longer reads: {sorted(stale)}"


def test_every_row_has_meaning_default_and_unit() -> None:
    for line in PAGE.read_text().splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            assert len(cells) == 5 and all(cells), f"a row needs all five cells: {line}"


def _only_set(name: str) -> bool:
    """Named only as a keyword argument of the launcher's worker environment."""
    text = (ROOT / "asyncdist" / "launcher" / "job.py").read_text()
    others = [p for p in (ROOT / "asyncdist").rglob("*.py") if p.name != "job.py"]
    return f"{name}=" in text and not any(name in p.read_text() for p in others)

"""Every Python code block of README.md and docs/ runs, so that none rots.

A fence runs as it is written; an HTML comment on the line just above it (invisible on
the site) says how, when it needs more than one process:

    <!-- snippet: ranks=2 -->               rank processes from asyncdist.testing.spawn,
                                            with a launcher's environment (env:// works)
    <!-- snippet: ranks=2 own-store -->     as started by hand: rank 0 serves the store
                                            at MASTER_PORT (a free port), as in the README
    <!-- snippet: raises=PeerLostError match="closed" -->
                                            the block shows a deliberate error: it must
                                            raise it (with its message), on some rank
    <!-- snippet: pytest -->                a test file: run by pytest in a fresh folder
    <!-- snippet: requires=cuda -->         skipped (with that reason) where CUDA is absent
                                            (a block that imports torch is skipped where torch is)
    <!-- snippet: skip: REASON -->          not run; the reason is required, and shown

A block without a comment runs as a script (``python snippet.py`` in a fresh folder),
which is what a reader who copies it does. Every run is bounded (60 s). Port 29500,
which the pages show the reader, becomes a free port, /tmp/asyncdist-rendezvous a file
in the test's own folder, and ``sys.argv[1]`` is the rank.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from asyncdist.testing import spawn

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PYTHON = {"python", "py", "python3"}
TIMEOUT = 60.0

_FENCE = re.compile(r"^```(?P<lang>[\w+-]*)[^\n]*\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)
_DIRECTIVE = re.compile(r"<!--\s*snippet:\s*(?P<spec>.*?)\s*-->\s*\Z", re.S)


@dataclass
class Snippet:
    page: Path
    line: int
    source: str
    options: dict[str, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def _options(spec: str) -> dict[str, str]:
    if spec.startswith("skip"):
        reason = spec.partition(":")[2].strip()
        return {"skip": reason}
    return {k: v for k, _, v in (word.partition("=") for word in shlex.split(spec))}


def collect(page: Path) -> list[Snippet]:
    text = page.read_text()
    snippets = []
    for fence in _FENCE.finditer(text):
        if fence.group("lang") not in PYTHON:
            continue
        before = text[: fence.start()].rstrip()
        directive = _DIRECTIVE.search(before[before.rfind("\n") + 1 :]) if before else None
        options = _options(directive.group("spec")) if directive else {}
        line = text.count("\n", 0, fence.start()) + 2  # the block's first line of code
        snippets.append(Snippet(page, line, fence.group("body"), options))
    return snippets


SNIPPETS = [s for page in PAGES for s in collect(page)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_in_rank(source: str, name: str, folder: str, env: dict[str, str]) -> None:
    """Run one snippet as ``__main__`` on this rank (module level: spawn pickles it)."""
    os.environ.update(env)
    os.chdir(folder)
    sys.argv = [name, os.environ["RANK"]]
    exec(compile(source, name, "exec"), {"__name__": "__main__", "__file__": name})


def _raised(snippet: Snippet) -> tuple[type[BaseException], str | None] | None:
    name = snippet.options.get("raises")
    if name is None:
        return None
    import builtins

    import asyncdist.errors

    kind = getattr(asyncdist.errors, name, None) or getattr(builtins, name, None)
    assert isinstance(kind, type), f"{snippet.id}: raises={name}: no such error"
    return kind, snippet.options.get("match")


def _script(snippet: Snippet, source: str, folder: Path) -> None:
    path = folder / "snippet.py"
    path.write_text(source)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, str(path)], cwd=folder, env=env, capture_output=True,
                            text=True, timeout=TIMEOUT)
    assert result.returncode == 0, f"{snippet.id} failed:\n{result.stdout}\n{result.stderr}"


def _pytest(snippet: Snippet, source: str, folder: Path) -> None:
    (folder / "test_snippet.py").write_text(source)
    (folder / "pytest.ini").write_text(
        "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
        "addopts = --strict-markers -p no:cacheprovider\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "test_snippet.py"], cwd=folder,
                            env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, f"{snippet.id} failed:\n{result.stdout}\n{result.stderr}"


_IMPORTS_TORCH = re.compile(r"^\s*(import|from) torch\b", re.MULTILINE)


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[s.id for s in SNIPPETS])
def test_snippet_runs(snippet: Snippet, tmp_path: Path) -> None:
    options = snippet.options
    if "skip" in options:
        assert options["skip"], f"{snippet.id}: a skipped block needs its reason beside it"
        pytest.skip(options["skip"])
    if options.get("requires") == "cuda":
        torch = pytest.importorskip("torch")
        if not torch.cuda.is_available():
            pytest.skip("needs CUDA")
    if _IMPORTS_TORCH.search(snippet.source):
        pytest.importorskip("torch")  # an optional dependency
    source = snippet.source.replace("29500", str(_free_port()))
    source = source.replace("/tmp/asyncdist-rendezvous", str(tmp_path / "rendezvous"))
    if "pytest" in options:
        return _pytest(snippet, source, tmp_path)
    expected = _raised(snippet)
    if "ranks" not in options:
        if expected is None:
            return _script(snippet, source, tmp_path)
        options = {**options, "ranks": "1"}
    env: dict[str, str] = {}
    if "own-store" in options:  # as when started by hand: rank 0 serves the store
        env = {"MASTER_PORT": str(_free_port()), "TORCHELASTIC_USE_AGENT_STORE": "0"}
    args = (source, snippet.id, str(tmp_path), env)
    if expected is None:
        spawn(int(options["ranks"]), run_in_rank, *args, timeout=TIMEOUT)
        return None
    kind, match = expected
    with pytest.raises(kind, match=match):
        spawn(int(options["ranks"]), run_in_rank, *args, timeout=TIMEOUT)
    return None


def test_every_page_is_collected() -> None:
    """A page with a Python block no pattern above finds would go untested."""
    found = {s.page for s in SNIPPETS}
    for page in PAGES:
        if "```python" in page.read_text():
            assert page in found, page


def test_every_skip_has_a_reason() -> None:
    for snippet in SNIPPETS:
        if "skip" in snippet.options:
            assert len(snippet.options["skip"]) > 10, f"{snippet.id}: say why it is not run"

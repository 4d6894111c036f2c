"""Every error message quoted in docs/troubleshooting.md is one the code can raise.

Each line of a ``text`` block there reads ``ErrorClass: message``. The class must
be one of asyncdist.errors, and every fixed part of the message (the text
between the parts that vary: numbers, names in quotes, lists, dtypes and
shapes) must be spelled in asyncdist's source. A message reworded in the code,
or an error class renamed, fails this test until the page follows.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import asyncdist.errors

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "troubleshooting.md"

_TEXT_BLOCK = re.compile(r"^```text\n(.*?)^```", re.M | re.S)
# The parts of a message that vary between runs: numbers, quoted names, [lists],
# dtype[shape]s, host:port addresses, URLs, call #N; what is left between them is fixed text.
_VARYING = re.compile(r"\b[a-z]+://[^\s,;)]+|\[[^\]]*\]|'[^']*'|\d+(\.\d+)?( s\b)?|\w+\[[^\]]*\]|\([^()]*\)")


def quoted_messages() -> list[tuple[str, str]]:
    messages = []
    for block in _TEXT_BLOCK.findall(PAGE.read_text()):
        for line in block.splitlines():
            if line.strip():
                name, _, message = line.partition(": ")
                messages.append((name, message))
    return messages


def _source() -> str:
    text = "\n".join(p.read_text() for p in sorted((ROOT / "asyncdist").rglob("*.py")))
    # implicit concatenation of string literals across lines: "abc "\n    f"def" -> "abc def"
    return re.sub(r"""["']\s*\n\s*[rbf]*["']""", "", text)


SOURCE = _source()
MESSAGES = quoted_messages()


# Text that the operating system writes (strerror), not asyncdist.
OS_TEXT = ("Address already in use", "Connection refused", "Name or service not known")
# A word that code fills in: an identifier, a dtype, an op, a path or a number.
_FILLED = re.compile(r"^[\w.]*[_./#\d][\w.]*$|^(sum|int|float|recv|send|dst|src|tensor|torch|nccl|gloo|"
                     r"ranks?|destination|source|broadcast|reduce|gather|scatter|barrier)$")


def fixed_parts(message: str) -> list[str]:
    for text in OS_TEXT:
        message = message.replace(text, "|")
    parts = []
    for part in _VARYING.split(message):
        run: list[str] = []
        for word in (part or "").split() + [""]:
            if word and not _FILLED.match(word.strip(":;,.()")):
                run.append(word)
                continue
            chunk = " ".join(run).strip(" :;,.()|")
            if len(chunk) >= 8 and " " in chunk:
                parts.append(chunk)
            run = []
    return parts


def test_the_page_quotes_messages() -> None:
    assert len(MESSAGES) >= 30


def _spelled(part: str) -> bool:
    """In the source as it is, or in two pieces around one field the code fills in."""
    if part in SOURCE:
        return True
    words = part.split()
    return any(" ".join(words[:i]) in SOURCE and " ".join(words[i:]) in SOURCE
               for i in range(3, len(words) - 2))


@pytest.mark.parametrize("name, message", MESSAGES, ids=[f"{n}: {m[:50]}" for n, m in MESSAGES])
def test_quoted_message_matches_the_code(name: str, message: str) -> None:
    assert isinstance(getattr(asyncdist.errors, name, None), type), f"{name} is not in asyncdist.errors"
    missing = [part for part in fixed_parts(message) if not _spelled(part)]
    assert not missing, f"{name}: no code spells {missing}"

"""The rows of a run as Markdown tables, for the reference page (:mod:`.document`).

The same rows and ratios as :mod:`.report`'s text tables, computed by its
cell functions: times, floors, overheads and ratios, no bandwidth (the
page's plots carry it).
"""

from __future__ import annotations

from typing import Callable

from .cases import CASES
from .floor import Floor
from .plan import SERIES, Series, format_bytes
from .report import (
    Cells, any_row, facade_overheads, grouped, multiple_of, number, overhead_of, ratio_of, ratios, references, time_of,
)
from .runner import Row

__all__ = ["size_text", "markdown_tables", "markdown_summary"]

_AWAIT, _FACADE = SERIES["await"], SERIES["facade"]


def _us(value: float | None) -> str:
    """A time in a Markdown cell: three figures or more, thousands grouped."""
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else format(value, ".1f" if value >= 10 else ".2f")


def size_text(nbytes: int) -> str:
    """``8`` -> ``"8 B"``, ``1024`` -> ``"1 KiB"``, ``0`` (unsized) -> ``"-"``."""
    if not nbytes:
        return "-"
    text = format_bytes(nbytes)
    return f"{text[:-1]} {text[-1]}iB" if text[-1] in "KMG" else f"{text} B"


def _markdown_columns(series: list[Series], floor: Floor | None) -> list[tuple[str, Callable[[Cells], str]]]:
    def time(s: Series) -> Callable[[Cells], str]:
        return lambda c: _us(time_of(c, s))

    def multiple(s: Series, floor: Floor) -> Callable[[Cells], str]:
        return lambda c: number(multiple_of(c, s, floor), ".1f")

    def ratio(s: Series, ref: Series) -> Callable[[Cells], str]:
        return lambda c: number(ratio_of(c, s, ref))

    mine = [s for s in series if not s.reference]
    columns: list[tuple[str, Callable[[Cells], str]]] = [("size", lambda c: size_text(any_row(c).nbytes))]
    for s in series:
        columns.append((f"{s.label} (us)", time(s)))
        if floor is not None and not s.reference:
            columns.append((f"{s.label} xfloor", multiple(s, floor)))
    if _AWAIT in series and _FACADE in series:
        columns.append(("facade overhead (us)", lambda c: number(overhead_of(c), "+.1f")))
    columns += [(f"{ref.label} / {s.label}", ratio(s, ref)) for ref in references(series) for s in mine]
    return columns


def _markdown_table(headings: list[str], body: list[list[str]]) -> list[str]:
    """A Markdown table, the first column left-aligned, the others right; columns
    with no value in any row are left out."""
    keep = [i for i in range(len(headings)) if i == 0 or any(row[i] != "-" for row in body)]
    lines = ["| " + " | ".join(headings[i] for i in keep) + " |", "|---|" + "---:|" * (len(keep) - 1)]
    return lines + ["| " + " | ".join(row[i] for i in keep) + " |" for row in body]


def markdown_tables(rows: list[Row], series: list[Series], floor: Floor | None = None, level: int = 3) -> list[str]:
    """One Markdown table per op (a heading of ``level``), one line per size: each
    series' time, the asyncdist series' time in floors for small rows, the
    facade's overhead, and each reference's time over each asyncdist series'."""
    lines: list[str] = []
    for op, sizes in grouped(rows).items():
        present = [s for s in series if any(s in cells for cells in sizes.values())]
        columns = _markdown_columns(present, floor)
        n = any_row(next(iter(sizes.values()))).world_size
        # the note less its busbw clause: these tables show no bandwidth
        note = "; ".join(part for part in CASES[op].note.split("; ") if not part.startswith("busbw"))
        lines += [f"{'#' * level} {op}, {n} ranks", ""] + ([note, ""] if note else [])
        body = [[cell(c) for _, cell in columns] for c in sizes.values()]
        lines += _markdown_table([name for name, _ in columns], body)
        lines.append("")
    return lines


def markdown_summary(rows: list[Row], series: list[Series]) -> list[str]:
    """Per op, each reference's time over each asyncdist series' (geometric mean over
    sizes) and the facade's median overhead, as a Markdown table; none if neither ran."""
    pairs = [(ref, s) for ref in references(series) for s in series if not s.reference]
    per_pair = [ratios(rows, s, ref) for ref, s in pairs]
    overheads = facade_overheads(rows)
    if not any(per_pair) and not overheads:
        return []
    headings = ["op", *(f"{ref.label} / {s.label}" for ref, s in pairs), "facade overhead (us)"]
    body = [[op, *(number(ratio.get(op)) for ratio in per_pair), number(overheads.get(op), "+.1f")]
            for op in grouped(rows)]
    return _markdown_table(headings, body)

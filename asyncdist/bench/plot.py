"""``--plot FILE.png``: bus bandwidth and latency against size, every series.

matplotlib is optional (the ``plot`` extra: ``pip install "asyncdist[plot]"``)
and imported only here, inside functions, with the non-interactive Agg
backend. :func:`missing` lets the command line refuse ``--plot`` before a
sweep starts, rather than run for minutes and then have nothing to draw with.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from .cases import CASES
from .plan import format_bytes
from .runner import Row

__all__ = ["missing", "write_plot"]

# One colour per op, one line style per series.
_STYLES: dict[str, Any] = {"await": "-", "facade": ":", "torch": "--", "mpi4py": "-."}  # matplotlib's line styles


def missing() -> str | None:
    """Why a plot cannot be drawn (matplotlib not installed), or None."""
    try:
        found = importlib.util.find_spec("matplotlib") is not None
    except ValueError:  # a stub in sys.modules without a spec
        found = False
    if found:
        return None
    return "--plot needs matplotlib, which is not installed: pip install 'asyncdist[plot]' (or matplotlib)"


def write_plot(rows: list[Row], path: str | Path) -> None:
    """Draw two log-log panels, busbw and time against size, into ``path`` (PNG).

    Rows without a size (barrier, the DDP step) are left out.

    Raises:
        ImportError: matplotlib is not installed (see :func:`missing`).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter

    sized = [r for r in rows if r.count and CASES[r.op].sized]
    ops = list(dict.fromkeys(r.op for r in sized))
    series = list(dict.fromkeys(r.series for r in sized))
    colours = {op: plt.get_cmap("tab10")(i % 10) for i, op in enumerate(ops)}
    fig, (bw_ax, time_ax) = plt.subplots(1, 2, figsize=(13, 5.5))
    for op in ops:
        for s in series:
            line = sorted((r for r in sized if r.op == op and r.series == s), key=lambda r: r.nbytes)
            style = {"color": colours[op], "linestyle": _STYLES.get(s.api, "-"), "marker": "."}
            sizes = [r.nbytes for r in line]
            bw_ax.plot(sizes, [r.busbw or float("nan") for r in line], **style)
            time_ax.plot(sizes, [r.time_us for r in line], **style)
    world = sized[0].world_size if sized else 0
    for ax, title, ylabel in (
        (bw_ax, "bus bandwidth", "busbw (GB/s)"),
        (time_ax, "latency", "time per call (us)"),
    ):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: format_bytes(int(x)) if x >= 1 else ""))
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title}, {world} ranks")
        ax.grid(True, which="both", alpha=0.3)
    # Two small legends instead of one per line: colour = op, line style = series.
    bw_ax.legend([Line2D([], [], color=colours[op]) for op in ops], ops, title="op", fontsize="small", loc="upper left")
    time_ax.legend(
        [Line2D([], [], color="black", linestyle=_STYLES.get(s.api, "-")) for s in series],
        [s.label for s in series],
        title="library",
        fontsize="small",
        loc="upper left",
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

"""What every analysis writes: ``results.json`` (plain JSON, non-finite numbers as null), a plain-text table
and its figures as PNG files (matplotlib's ``Figure`` directly, no pyplot state; the ``plots`` extra).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import TxlError
from ..files import atomic_open, atomic_write_text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "SIGN_CONVENTION",
    "PlotsUnavailable",
    "Reportable",
    "new_figure",
    "format_table",
    "plain",
    "plain_ticks",
    "run_label",
    "write_report",
]

PLOTS_HINT = "pip install 'transformer-xl[plots]'"

SIGN_CONVENTION = (
    "differences are the Transformer-XL's figure minus the vanilla model's: negative means the "
    "Transformer-XL is lower, i.e. better"
)
"""The one sign of the comparisons of ``txl compare`` and ``txl demo``, stated in the header of both tables."""


class PlotsUnavailable(TxlError):
    """matplotlib is not installed: the figures were not drawn (results.json was written)."""


class Reportable(Protocol):
    """An analysis result: its numbers as JSON, a table to print, and its figures (name -> builder)."""

    def as_dict(self) -> dict[str, Any]: ...

    def table(self) -> str: ...

    def figures(self) -> Mapping[str, Callable[[], Figure]]: ...


def new_figure(*, width: float = 6.4, height: float = 4.0) -> Figure:
    """An empty matplotlib figure (constrained layout); :class:`PlotsUnavailable` without matplotlib."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotsUnavailable(
            f"figures need matplotlib, which is not installed: {PLOTS_HINT} "
            "(results.json was written; plots=False skips the figures)",
            fields=("plots=False",),
        ) from None
    return Figure(figsize=(width, height), layout="constrained")


def plain_ticks(figure: Figure) -> Figure:
    """Tick labels as plain values on every linear axis of ``figure``: no offset (``+6.373`` in a corner,
    the ticks counted from it) and no scientific notation, which matplotlib picks for narrow ranges."""
    from matplotlib.ticker import ScalarFormatter

    for ax in figure.axes:
        for axis in (ax.xaxis, ax.yaxis):
            formatter = axis.get_major_formatter()
            if isinstance(formatter, ScalarFormatter):
                formatter.set_useOffset(False)
                formatter.set_scientific(False)
    return figure


def run_label(run_dir: str | Path) -> str:
    """A short name for a run folder in legends and titles: its last two path components."""
    return "/".join(Path(run_dir).parts[-2:])


def plain(value: Any) -> Any:
    """JSON-ready values: tuples as lists, numpy scalars as Python numbers, NaN and infinities as None."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
            return f"{value:.3e}"
        return f"{value:.4f}" if abs(value) < 10 else f"{value:,.1f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    return str(value)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table: a header, a rule, one line per row; numbers right-aligned, text left-aligned."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    numeric = [
        all(isinstance(row[i], (int, float)) or row[i] is None for row in rows) for i in range(len(headers))
    ]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True)
        )

    return "\n".join([line(headers), "  ".join("-" * w for w in widths), *(line(r) for r in cells)])


def write_report(out: Path, result: Reportable, *, plots: bool = True, dpi: int = 120) -> list[Path]:
    """Write ``out/results.json`` and, with ``plots``, each figure as ``out/NAME.png``; returns the files
    written. Raises :class:`PlotsUnavailable` after writing the JSON when matplotlib is missing."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    atomic_write_text(path, json.dumps(plain(result.as_dict()), indent=1, allow_nan=False) + "\n")
    written = [path]
    if plots:
        for name, build in result.figures().items():
            figure = plain_ticks(build())
            with atomic_open(out / f"{name}.png", "wb") as fh:
                figure.savefig(fh, dpi=dpi, format="png")
            written.append(out / f"{name}.png")
    return written

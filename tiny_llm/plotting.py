"""Shared figure helpers (torch-free): compact tick labels, distinguishable line styles, atomic PNG writes.

matplotlib is imported inside the functions that draw, so importing this module stays cheap.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from tiny_llm.io import atomic_write_bytes

_UNITS = ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k"))
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")
_LINESTYLES = ("-", "--", ":", "-.")


def compact_number(value: float) -> str:
    """A short tick label: 950, 12.5k, 100k, 1.2M, 3B (at most three significant digits)."""
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    size = abs(value)
    for scale, unit in _UNITS:
        if size >= scale * 0.9995:  # 999,600 is "1M", not "1e+03k"
            return f"{sign}{_significant(size / scale)}{unit}"
    return f"{sign}{_significant(size)}"


def _significant(value: float) -> str:
    text = f"{value:.3g}"
    return str(int(float(text))) if "e" in text else text


def compact_axis(axis: Any, *, integer: bool = False) -> None:
    """At most ~6 ticks on a matplotlib Axis, labelled with ``compact_number``."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    axis.set_major_locator(MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10], integer=integer))
    axis.set_major_formatter(FuncFormatter(lambda value, _pos: compact_number(value)))


def plain_log_axis(axis: Any) -> None:
    """A log-scale Axis that spans at most two decades labelled 0.2, 0.3, 0.6 rather than 2×10⁻¹, 3×10⁻¹,
    6×10⁻¹ (its minor ticks carry most labels there); a wider one keeps matplotlib's powers of ten."""
    from matplotlib.ticker import LogFormatterSciNotation

    class PlainWhereNarrow(LogFormatterSciNotation):
        def __call__(self, x: float, pos: int | None = None) -> str:
            label = super().__call__(x, pos)
            if not label or self.axis is None:
                return label
            low, high = sorted(self.axis.get_view_interval())
            return f"{x:g}" if low > 0 and high <= 100 * low else label

    axis.set_major_formatter(PlainWhereNarrow())
    axis.set_minor_formatter(PlainWhereNarrow(labelOnlyBase=False, minor_thresholds=(2, 0.4)))


def line_styles(count: int) -> list[dict[str, Any]]:
    """``count`` plot() keyword sets that stay distinguishable when curves coincide exactly.

    Colour, marker shape and dash pattern all change from one line to the next; markers are hollow and
    shrink with the index, and lines get thinner, so identical curves show as nested markers and dashes.
    """
    styles = []
    for index in range(count):
        shrink = index / max(count - 1, 1)
        styles.append(
            {
                "color": f"C{index % 10}",
                "marker": _MARKERS[index % len(_MARKERS)],
                "linestyle": _LINESTYLES[index % len(_LINESTYLES)],
                "markerfacecolor": "none",
                "markersize": 9.0 - 4.0 * shrink,
                "linewidth": 2.2 - 1.2 * shrink,
                "markeredgewidth": 1.3,
            }
        )
    return styles


def save_png(fig: Any, path: str | Path, dpi: int = 110) -> None:
    """Render ``fig`` (legends outside the axes included) and replace ``path`` atomically; closes ``fig``."""
    import matplotlib.pyplot as plt

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.render.png")
    try:
        fig.savefig(tmp, dpi=dpi, bbox_inches="tight")
    finally:
        plt.close(fig)
    atomic_write_bytes(target, tmp.read_bytes())
    tmp.unlink()

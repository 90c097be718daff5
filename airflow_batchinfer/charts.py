"""Small SVG charts, with no dependency beyond the standard library: the run report's plots, and
anything else that wants a trend in a browser.

Each chart function returns a whole SVG document as a ``str`` (an ``<svg>`` root with ``width``,
``height`` and a ``viewBox``, so it scales when a page sizes it); :func:`side_by_side` puts charts
next to each other in one document::

    pending = Series("pending", [2000, 905, 420], color="#bbb")
    approved = Series("approved", [1095, 485, 229], color="#2a7")
    svg = side_by_side(
        bar_chart([0, 1, 2], [pending, approved], overlay=True, title="records per round", x_label="round"),
        line_chart([0, 1, 2], [Series("tokens / s", [36e3, 37e3, 34e3])], title="throughput"),
    )

Every text (titles, labels, legend, category names) is escaped, and nothing executes, so a document
can be written to a file or inlined in HTML as it is. A value that is ``None``, NaN or not a number
is skipped (no bar, no point); a chart with nothing to draw says "no data".
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

__all__ = ["Series", "bar_chart", "compact", "line_chart", "nice_ticks", "side_by_side"]

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
_FONT = "font-family: sans-serif"
_CHAR_W = 6.2  # rough width of a 10px sans-serif character, for laying out tick labels


@dataclass(frozen=True)
class Series:
    """One named sequence of values, one per category (bars) or x (lines); ``color`` is any CSS
    colour, by default the next one of :data:`PALETTE`."""

    name: str
    values: Sequence[Any]
    color: str | None = None


def compact(value: float) -> str:
    """A number in at most three significant digits, with k, M, G or T for thousands and up:
    ``1234 -> "1.23k"``, ``3.4e6 -> "3.4M"``, ``0.25 -> "0.25"``, ``1.0 -> "1"``."""
    if value == 0:
        return "0"
    for suffix in ("", "k", "M", "G"):
        if abs(value) < 999.5:
            return f"{value:.3g}" + suffix
        value /= 1000
    return f"{value:.3g}T"


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values (steps of 1, 2 or 5 times a power of ten) that cover
    ``lo..hi``: ``nice_ticks(0, 937) == [0, 200, 400, 600, 800, 1000]``."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"ticks for a range that is not finite: {lo}..{hi}")
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        lo, hi = (lo - 1, hi + 1) if lo == 0 else (lo - abs(lo) / 2, hi + abs(hi) / 2)
    step = _nice_step((hi - lo) / max(count, 1))
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    digits = max(0, -math.floor(math.log10(step)))
    return [round(i * step, digits) for i in range(first, last + 1)]


def _nice_step(rough: float) -> float:
    """1, 2 or 5 times a power of ten, whichever is nearest ``rough``."""
    power: float = 10.0 ** math.floor(math.log10(rough))
    ratio = rough / power
    return power * (1 if ratio < 1.5 else 2 if ratio < 3 else 5 if ratio < 7 else 10)


def bar_chart(
    categories: Sequence[Any],
    series: Sequence[Series],
    *,
    overlay: bool = False,
    title: str = "",
    x_label: str = "",
    y_label: str = "",
    y_range: tuple[float, float] | None = None,
    width: int = 480,
    height: int = 300,
) -> str:
    """Bars per category (shown as ``str(category)``), one per series: side by side in each
    category, or with ``overlay=True`` drawn over each other in the order given (so put the larger
    series first). ``y_range`` fixes the y axis, e.g. ``(0, 1.1)``; by default it covers zero and
    every value, up to a round tick. Bars carry ``class="bar s<series index>"`` and a tooltip."""
    chart = _Chart(title, x_label, y_label, width, height, series)
    values = [[_num(v) for v in s.values] for s in series]
    if not categories or not any(v is not None for vs in values for v in vs):
        return chart.no_data()
    ys = chart.y_scale(values, y_range)
    band = chart.plot_w / len(categories)
    lanes = 1 if overlay else len(series)
    bar_w = band * 0.8 / lanes
    for i, cat in enumerate(categories):
        for k, (s, vs) in enumerate(zip(series, values, strict=True)):
            v = vs[i] if i < len(vs) else None
            if v is None:
                continue
            x = chart.left + band * (i + 0.1) + (0 if overlay else k * bar_w)
            y0, y1 = sorted((ys(0), ys(v)))
            tip = f"{cat} · {s.name}: {compact(v)}" if s.name else f"{cat}: {compact(v)}"
            chart.add(
                f'<rect class="bar s{k}" x="{_f(x)}" y="{_f(y0)}" width="{_f(bar_w)}" '
                f'height="{_f(y1 - y0)}" fill="{_e(chart.colors[k])}"><title>{_e(tip)}</title></rect>'
            )
    chart.x_labels([(chart.left + band * (i + 0.5), str(c)) for i, c in enumerate(categories)], band)
    return chart.svg()


def line_chart(
    xs: Sequence[Any],
    series: Sequence[Series],
    *,
    title: str = "",
    x_label: str = "",
    y_label: str = "",
    y_range: tuple[float, float] | None = None,
    width: int = 480,
    height: int = 300,
) -> str:
    """Lines with a marker at each point, one line per series. ``xs`` that are all numbers are
    placed by value (ticks at each x when there are at most 12, else round ticks); otherwise they
    are categories, evenly spaced. A missing value breaks its line. Points carry
    ``class="point s<series index>"``, lines ``class="line s<series index>"``."""
    chart = _Chart(title, x_label, y_label, width, height, series)
    values = [[_num(v) for v in s.values] for s in series]
    if not xs or not any(v is not None for vs in values for v in vs):
        return chart.no_data()
    ys = chart.y_scale(values, y_range)
    numeric = [_num(x) for x in xs]
    if all(x is not None for x in numeric):
        nums = [x for x in numeric if x is not None]
        lo, hi = min(nums), max(nums)
        pad = (hi - lo) * 0.05 or 0.5
        ticks = sorted(set(nums)) if len(set(nums)) <= 12 else nice_ticks(lo, hi, 6)
        lo, hi = min(lo - pad, ticks[0]), max(hi + pad, ticks[-1])
        to_x = [chart.left + (x - lo) / (hi - lo) * chart.plot_w for x in nums]
        labels = [(chart.left + (t - lo) / (hi - lo) * chart.plot_w, compact(t)) for t in ticks]
        room = chart.plot_w / max(len(ticks), 1)
    else:
        room = chart.plot_w / len(xs)
        to_x = [chart.left + room * (i + 0.5) for i in range(len(xs))]
        labels = [(x, str(c)) for x, c in zip(to_x, xs, strict=True)]
    for k, (s, vs) in enumerate(zip(series, values, strict=True)):
        color = _e(chart.colors[k])
        runs: list[list[tuple[float, float]]] = [[]]
        for i, x in enumerate(to_x):
            v = vs[i] if i < len(vs) else None
            if v is None:
                runs.append([])
                continue
            runs[-1].append((x, ys(v)))
            tip = f"{xs[i]} · {s.name}: {compact(v)}" if s.name else f"{xs[i]}: {compact(v)}"
            chart.add(
                f'<circle class="point s{k}" cx="{_f(x)}" cy="{_f(ys(v))}" r="3.5" fill="{color}">'
                f"<title>{_e(tip)}</title></circle>"
            )
        for run in (r for r in runs if len(r) > 1):
            points = " ".join(f"{_f(x)},{_f(y)}" for x, y in run)
            chart.add(
                f'<polyline class="line s{k}" points="{points}" fill="none" stroke="{color}" '
                'stroke-width="2"/>',
                under=True,
            )
    chart.x_labels(labels, room)
    return chart.svg()


def side_by_side(*charts: str, gap: int = 0) -> str:
    """The given chart documents next to each other, left to right, in one SVG document as tall as
    the tallest. Each must be an ``<svg>`` root with numeric ``width`` and ``height`` (as this
    module writes them); none gives a "no data" document."""
    if not charts:
        return _Chart("", "", "", 480, 300, []).no_data()
    parts, x, tall = [], 0.0, 0.0
    for doc in charts:
        root = _ROOT.match(doc)
        size = [re.search(rf'\s{a}="([\d.]+)"', root.group(0)) for a in ("width", "height")] if root else []
        if not (root and size[0] and size[1]):
            raise ValueError("side_by_side takes <svg> documents with a numeric width and height")
        w, h = float(size[0].group(1)), float(size[1].group(1))
        parts.append(f'<svg x="{_f(x)}" y="0"' + doc[root.end("tag") :])
        x, tall = x + w + gap, max(tall, h)
    return _doc(x - gap, tall, "".join(parts))


_ROOT = re.compile(r"\s*(?P<tag><svg)\b[^>]*>")


class _Chart:
    """Layout of one chart: margins for the title, legend and labels, the plot area, a y scale."""

    def __init__(
        self, title: str, x_label: str, y_label: str, width: int, height: int, series: Sequence[Series]
    ) -> None:
        self.title, self.x_label, self.y_label = title, x_label, y_label
        self.width, self.height = width, height
        self.series = list(series)
        self.colors = [s.color or PALETTE[k % len(PALETTE)] for k, s in enumerate(self.series)]
        self.top = (24 if title else 10) + (18 if len(self.series) > 1 else 0)
        self.bottom = height - (22 + (16 if x_label else 0))
        self.left = 40.0 + (16 if y_label else 0)
        self.plot_w = width - self.left - 12
        self.under: list[str] = []  # drawn first (grid, lines), then the marks
        self.marks: list[str] = []

    def add(self, element: str, *, under: bool = False) -> None:
        (self.under if under else self.marks).append(element)

    def y_scale(self, values: list[list[float | None]], y_range: tuple[float, float] | None) -> Any:
        """Grid lines and y tick labels; returns value -> y pixel."""
        if y_range is not None:
            lo, hi = sorted(y_range)
            ticks = [t for t in nice_ticks(lo, hi) if lo - 1e-9 <= t <= hi + 1e-9]
        else:
            seen = [v for vs in values for v in vs if v is not None]
            low, high = min(0.0, *seen), max(0.0, *seen)
            ticks = nice_ticks(low, high if high > low else 1.0)
            lo, hi = ticks[0], ticks[-1]
        labels = [compact(t) for t in ticks]
        self.left += max(0, max(len(t) for t in labels) - 4) * _CHAR_W
        self.plot_w = self.width - self.left - 12
        top, bottom = self.top, self.bottom

        def to_y(v: float) -> float:
            return bottom - (min(max(v, lo), hi) - lo) / (hi - lo) * (bottom - top)

        for t, label in zip(ticks, labels, strict=True):
            y = _f(to_y(t))
            stroke = "#999" if t == 0 else "#e5e5e5"
            self.add(
                f'<line x1="{_f(self.left)}" x2="{_f(self.width - 12)}" y1="{y}" y2="{y}" '
                f'stroke="{stroke}" stroke-width="1"/>',
                under=True,
            )
            self.add(
                f'<text x="{_f(self.left - 5)}" y="{y}" dy="0.32em" text-anchor="end" '
                f'font-size="10" fill="#555">{_e(label)}</text>',
                under=True,
            )
        return to_y

    def x_labels(self, labels: list[tuple[float, str]], room: float) -> None:
        """Labels under the plot, every n-th one when they would overlap."""
        widest = max((len(text) for _, text in labels), default=0) * _CHAR_W + 6
        every = max(1, math.ceil(widest / max(room, 1)))
        for x, text in labels[::every]:
            self.add(
                f'<text x="{_f(x)}" y="{_f(self.bottom + 14)}" text-anchor="middle" '
                f'font-size="10" fill="#555">{_e(text)}</text>'
            )

    def _frame(self) -> str:
        out = []
        if self.title:
            out.append(
                f'<text x="{_f(self.width / 2)}" y="16" text-anchor="middle" font-size="13" '
                f'font-weight="bold" fill="#222">{_e(self.title)}</text>'
            )
        if len(self.series) > 1:  # the legend, right-aligned above the plot
            x = self.width - 12.0
            y = self.top - 12
            for s, color in reversed(list(zip(self.series, self.colors, strict=True))):
                x -= len(s.name) * _CHAR_W
                out.append(
                    f'<text x="{_f(x)}" y="{_f(y)}" dy="0.32em" font-size="10" '
                    f'fill="#333">{_e(s.name)}</text>'
                )
                x -= 14
                out.append(
                    f'<rect class="legend" x="{_f(x)}" y="{_f(y - 5)}" width="10" height="10" '
                    f'fill="{_e(color)}"/>'
                )
                x -= 10
        if self.x_label:
            out.append(
                f'<text x="{_f(self.left + self.plot_w / 2)}" y="{self.height - 6}" '
                f'text-anchor="middle" font-size="11" fill="#333">{_e(self.x_label)}</text>'
            )
        if self.y_label:
            mid = _f((self.top + self.bottom) / 2)
            out.append(
                f'<text transform="translate(13 {mid}) rotate(-90)" text-anchor="middle" '
                f'font-size="11" fill="#333">{_e(self.y_label)}</text>'
            )
        return "".join(out)

    def svg(self) -> str:
        return _doc(self.width, self.height, self._frame() + "".join(self.under) + "".join(self.marks))

    def no_data(self) -> str:
        self.series = []  # no legend
        note = (
            f'<text x="{_f(self.width / 2)}" y="{_f(self.height / 2)}" text-anchor="middle" '
            'font-size="12" fill="#888">no data</text>'
        )
        return _doc(self.width, self.height, self._frame() + note)


def _doc(width: float, height: float, body: str) -> str:
    w, h = _f(width), _f(height)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
        f'style="{_FONT}"><rect class="background" width="100%" height="100%" fill="#fff"/>{body}</svg>'
    )


def _num(value: Any) -> float | None:
    """A finite float, or None for what cannot be drawn (None, NaN, infinities, non-numbers)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _f(x: float) -> str:
    """A coordinate, with at most one decimal."""
    return f"{x:.1f}".removesuffix(".0")


def _e(text: Any) -> str:
    return escape(str(text), quote=True)

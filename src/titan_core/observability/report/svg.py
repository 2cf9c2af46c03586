"""Line charts as inline SVG, drawn here: the page needs no script and no network.

Each chart is ``<svg class="chart" data-metric=...>`` with its plot area marked
``class="plot-area"`` (the browser test looks there for drawn lines). Non-finite values
break a line into pieces; a series of one point is a dot.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

WIDTH, HEIGHT = 520, 280
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 12, 40
# Colour-blind-safe (Okabe-Ito), then two greys; runs beyond these repeat with dashes.
COLORS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#999999"]


@dataclass(frozen=True)
class Mark:
    """A vertical line at ``step`` (a loss spike the guard skipped, a rollback, a fault-tolerance group gone or
    back): ``kind`` names it."""

    step: float
    kind: str
    label: str


MARK_COLORS = {"spike-skipped": "#D55E00", "spike-rollback": "#000000",
               "ft-left": "#B00020", "ft-rejoined": "#009E73"}  # fault tolerance: a group gone, a group back


@dataclass(frozen=True)
class Series:
    label: str
    points: list[tuple[float, float]]
    color: str
    dashed: bool = False
    breaks: tuple[float, ...] = ()  # steps where the line stops and starts again (a fault-tolerance group away)


def color_of(index: int) -> tuple[str, bool]:
    return COLORS[index % len(COLORS)], index >= len(COLORS)


def nice_ticks(low: float, high: float, count: int = 5, *, integer: bool = False) -> list[float]:
    """Round tick values covering [low, high] (about ``count`` of them; whole numbers if ``integer``)."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return [0.0]
    if high <= low:
        pad = abs(low) * 0.05 or 1.0
        low, high = low - pad, high + pad
    raw = (high - low) / max(count - 1, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    if integer:  # steps are whole numbers: no tick at 2.5
        step = max(1.0, step if step >= 10 else float(math.ceil(step)))
    start = math.floor(low / step) * step
    ticks: list[float] = []
    value = start
    while value <= high + step * 1e-9 and len(ticks) < 50:
        ticks.append(value)
        value += step
    if ticks[-1] < high:
        ticks.append(ticks[-1] + step)
    return ticks


def fmt(value: float) -> str:
    """A tick label: short, and exact enough to tell neighbouring ticks apart."""
    if value == 0:
        return "0"
    if abs(value) >= 1e5 or abs(value) < 1e-3:
        return f"{value:.1e}"
    return f"{value:,.4g}"


def _thin(points: list[tuple[float, float]], limit: int = 2000) -> list[tuple[float, float]]:
    """At most about ``limit`` points: every n-th, always keeping the last."""
    if len(points) <= limit:
        return points
    stride = math.ceil(len(points) / limit)
    return points[::stride] + ([points[-1]] if (len(points) - 1) % stride else [])


def line_chart(metric: str, title: str, series: list[Series], *, empty_note: str, marks: Sequence[Mark] = ()) -> str:
    """One chart; with no finite value in any series, a framed note saying why instead of lines. Each of
    ``marks`` is a vertical line ``<line class="mark" data-kind=.. data-step=..>`` across the plot area."""
    finite = [(x, y) for s in series for x, y in s.points if math.isfinite(x) and math.isfinite(y)]
    head = (f'<svg class="chart" data-metric="{escape(metric)}" xmlns="http://www.w3.org/2000/svg" '
            f'width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
            f'aria-label="{escape(title)}">')
    pw, ph = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    frame = f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="#ffffff" stroke="#cccccc"/>'
    if not finite:
        return (f'{head}<g class="plot-area empty">{frame}</g><text x="{LEFT + pw / 2}" y="{TOP + ph / 2}" '
                f'text-anchor="middle" font-size="13" fill="#666666">{escape(empty_note)}</text></svg>')
    xs, ys = [x for x, _ in finite], [y for _, y in finite]
    xt, yt = nice_ticks(min(xs), max(xs), integer=True), nice_ticks(min(ys), max(ys))
    x0, x1, y0, y1 = xt[0], xt[-1], yt[0], yt[-1]

    def px(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * pw

    def py(y: float) -> float:
        return TOP + ph - (y - y0) / (y1 - y0) * ph

    parts = [head, f'<g class="plot-area">{frame}']
    for t in yt:
        parts.append(f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{py(t):.1f}" y2="{py(t):.1f}" stroke="#eeeeee"/>')
    for s in series:
        dash = ' stroke-dasharray="6 3"' if s.dashed else ""
        piece: list[str] = []
        pieces: list[list[str]] = []
        previous = -math.inf
        for x, y in _thin(s.points):
            if piece and any(previous < b <= x for b in s.breaks):
                pieces.append(piece)
                piece = []
            previous = x
            if math.isfinite(x) and math.isfinite(y):
                piece.append(f"{px(x):.1f},{py(y):.1f}")
            elif piece:
                pieces.append(piece)
                piece = []
        if piece:
            pieces.append(piece)
        for p in pieces:
            if len(p) == 1:
                cx, cy = p[0].split(",")
                parts.append(f'<circle cx="{cx}" cy="{cy}" r="3" fill="{s.color}"/>')
            else:
                parts.append(f'<polyline fill="none" stroke="{s.color}" stroke-width="2"{dash} '
                             f'points="{" ".join(p)}"/>')
    for m in marks:
        if x0 <= m.step <= x1:
            dash = {"spike-rollback": "2 2", "ft-left": "8 2", "ft-rejoined": "1 3"}.get(m.kind, "5 3")
            parts.append(f'<line class="mark" data-kind="{escape(m.kind)}" data-step="{fmt(m.step)}" '
                         f'x1="{px(m.step):.1f}" x2="{px(m.step):.1f}" y1="{TOP}" y2="{TOP + ph}" '
                         f'stroke="{MARK_COLORS.get(m.kind, "#666666")}" stroke-width="1.5" stroke-dasharray="{dash}">'
                         f'<title>{escape(m.label)}</title></line>')
    parts.append("</g>")
    for t in yt:
        parts.append(f'<text x="{LEFT - 6}" y="{py(t) + 4:.1f}" text-anchor="end" font-size="11">{fmt(t)}</text>')
    for t in xt:
        parts.append(f'<text x="{px(t):.1f}" y="{TOP + ph + 16}" text-anchor="middle" font-size="11">{fmt(t)}</text>')
    parts.append(f'<text x="{LEFT + pw / 2}" y="{HEIGHT - 6}" text-anchor="middle" font-size="12">step</text>')
    parts.append("</svg>")
    return "".join(parts)

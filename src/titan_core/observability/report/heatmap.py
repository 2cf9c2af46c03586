"""Layer x step heatmaps of ``metrics.layer_stats`` (``layer/<id>/<figure>`` keys) and of ``[stability]
qk_clip_threshold`` (``qk_clip/<id>/<figure>``) as inline SVG.

One heatmap per run and figure: a row per block (layer 0 at the top), a column per logged step, each
cell coloured by its value on a log scale when every value is positive (norms span decades), else a
linear one. Each cell carries a ``<title>`` (layer, step, value) for a hover; a non-finite value is a
grey cell. The SVG is ``<svg class="heatmap" data-metric="<prefix><figure>" data-run=...>``.
"""

from __future__ import annotations

import math
from html import escape

from .runs import RunData
from .svg import fmt

# (key prefix, figure, title) in the order the page shows them.
FIGURES = [("layer/", "grad_norm", "gradient norm (before clipping)"),
           ("layer/", "update_ratio", "update / parameter norm"),
           ("layer/", "param_norm", "parameter norm"), ("layer/", "act_rms", "activation RMS (block output)"),
           ("layer/", "max_attn_logit", "largest attention logit (q.k * scale)"),
           ("qk_clip/", "max_logit_before", "QK-clip: largest attention logit before the clip"),
           ("qk_clip/", "clipped_heads", "QK-clip: heads clipped")]
# A perceptually ordered ramp (dark blue -> green -> yellow), interpolated between these stops.
RAMP = [(0x44, 0x01, 0x54), (0x3B, 0x52, 0x8B), (0x21, 0x90, 0x8C), (0x5D, 0xC8, 0x63), (0xFD, 0xE7, 0x25)]
CELL_W_MAX, CELL_H, LEFT, TOP, PLOT_W = 24.0, 14, 56, 8, 480
NAN_COLOR = "#bbbbbb"


def layer_series(run: RunData, prefix: str, figure: str) -> dict[str, list[tuple[float, float]]]:
    """Block id -> [(step, value)] of one figure (keys ``<prefix><id>/<figure>``), blocks in their numeric order."""
    found = {}
    for key, points in run.series.items():
        if key.startswith(prefix):
            layer, _, stat = key.removeprefix(prefix).rpartition("/")
            if layer and stat == figure:
                found[layer] = points
    order = sorted(found, key=lambda n: (0, int(n), "") if n.isdigit() else (1, 0, n))
    return {name: found[name] for name in order}


def color(t: float) -> str:
    """The ramp's colour at ``t`` in [0, 1]."""
    t = min(max(t, 0.0), 1.0) * (len(RAMP) - 1)
    i = min(int(t), len(RAMP) - 2)
    frac = t - i
    r, g, b = (round(a + (c - a) * frac) for a, c in zip(RAMP[i], RAMP[i + 1]))
    return f"#{r:02x}{g:02x}{b:02x}"


def heatmap(run: RunData, prefix: str, figure: str, title: str) -> str | None:
    """The SVG of one run's figure; None when the run recorded none of it."""
    rows = layer_series(run, prefix, figure)
    if not rows:
        return None
    steps = sorted({x for points in rows.values() for x, _ in points})
    column = {x: i for i, x in enumerate(steps)}
    values = [y for points in rows.values() for _, y in points if math.isfinite(y)]
    log = bool(values) and min(values) > 0
    scaled = [math.log10(v) for v in values] if log else values
    low, high = (min(scaled), max(scaled)) if scaled else (0.0, 1.0)
    span = high - low or 1.0
    cell_w = min(CELL_W_MAX, PLOT_W / len(steps))
    width = LEFT + cell_w * len(steps) + 8
    height = TOP + CELL_H * len(rows) + 44
    parts = [f'<svg class="heatmap" data-metric="{escape(prefix + figure)}" data-run="{escape(run.name)}" '
             f'xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height}" '
             f'viewBox="0 0 {width:.0f} {height}" role="img" aria-label="{escape(title)} per layer and step">']
    for r, (layer, points) in enumerate(rows.items()):
        y = TOP + r * CELL_H
        parts.append(f'<text x="{LEFT - 6}" y="{y + CELL_H - 3}" text-anchor="end" font-size="11">'
                     f'{escape(layer)}</text>')
        for step, value in points:
            fill = NAN_COLOR
            if math.isfinite(value):
                fill = color(((math.log10(value) if log else value) - low) / span)
            x = LEFT + column[step] * cell_w
            parts.append(f'<rect class="cell" x="{x:.1f}" y="{y}" width="{cell_w:.1f}" height="{CELL_H}" '
                         f'fill="{fill}"><title>layer {escape(layer)}, step {fmt(step)}: {fmt(value)}</title></rect>')
    bottom = TOP + CELL_H * len(rows)
    parts.append(f'<text x="{LEFT}" y="{bottom + 14}" font-size="11">step {fmt(steps[0])}</text>')
    parts.append(f'<text x="{LEFT + cell_w * len(steps)}" y="{bottom + 14}" text-anchor="end" font-size="11">'
                 f'step {fmt(steps[-1])}</text>')
    lo, hi = (10 ** low, 10 ** high) if log and values else (low, high)
    scale = "log scale" if log else "linear scale"
    parts.append(f'<rect x="{LEFT}" y="{bottom + 22}" width="12" height="10" fill="{color(0)}"/>'
                 f'<text x="{LEFT + 16}" y="{bottom + 31}" font-size="11">{fmt(lo)}</text>'
                 f'<rect x="{LEFT + 90}" y="{bottom + 22}" width="12" height="10" fill="{color(1)}"/>'
                 f'<text x="{LEFT + 106}" y="{bottom + 31}" font-size="11">{fmt(hi)} ({scale}; rows: layers)</text>')
    parts.append("</svg>")
    return "".join(parts)


def heatmaps(runs: list[RunData]) -> str:
    """The page's section of layer heatmaps; empty when no run recorded ``metrics.layer_stats``."""
    figures = []
    for prefix, figure, title in FIGURES:
        for run in runs:
            svg = heatmap(run, prefix, figure, title)
            if svg is not None:
                caption = f"{title}: {run.name}" if len(runs) > 1 else title
                figures.append(f"<figure><figcaption>{escape(caption)}</figcaption>{svg}</figure>")
    if not figures:
        return ""
    return f'<h2>Per layer (metrics.layer_stats, QK-clip)</h2><div class="charts">{"".join(figures)}</div>'

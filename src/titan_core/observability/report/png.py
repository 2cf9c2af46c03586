"""The loss curve as a PNG, for terminals and papers; needs matplotlib (the ``plot`` extra)."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence

from .runs import RunData
from .svg import MARK_COLORS, Mark, color_of

MISSING = "matplotlib is not installed, so no PNG of the loss was drawn; install it with pip install 'titan-core[plot]'"


def broken_at(points: Sequence[tuple[float, float]], breaks: Sequence[float]) -> tuple[list[float], list[float]]:
    """The points as x and y lists, with a NaN point wherever a break step falls between two of them
    (matplotlib does not join a line across NaN): a fault-tolerance group's line stops while it was away,
    as the SVG's does."""
    xs: list[float] = []
    ys: list[float] = []
    previous = -math.inf
    for x, y in points:
        if xs and any(previous < b <= x for b in breaks):
            xs.append(math.nan)
            ys.append(math.nan)
        xs.append(x)
        ys.append(y)
        previous = x
    return xs, ys


def loss_png(runs: list[RunData], *, marks: Sequence[Mark] = ()) -> bytes | None:
    """PNG bytes of training (solid) and validation (dashed) loss against steps; None without matplotlib."""
    try:
        # The object API without pyplot: no backend selection, no window, no global figure state,
        # and about half the import time (this runs at the end of every training run).
        from matplotlib.figure import Figure
    except ImportError:
        return None
    fig = Figure(figsize=(7, 4), dpi=100)
    ax = fig.add_subplot()
    for i, run in enumerate(runs):
        color, _ = color_of(i)
        for metric, style, label in (("loss", "-", run.name), ("val_loss", "--", f"{run.name} (validation)")):
            points = run.series.get(metric, [])
            if points:
                xs, ys = broken_at(points, run.breaks)
                ax.plot(xs, ys, style, color=color, label=label, marker="o" if len(points) == 1 else None)
    for run in runs:  # [stability]: the steps the spike guard skipped (dashed) and rolled back at (dotted)
        for key, style in (("spike_skipped", "--"), ("spike_rollback", ":")):
            for x, y in run.series.get(key, []):
                if y:
                    ax.axvline(x, linestyle=style, color="#D55E00" if key == "spike_skipped" else "#000000",
                               linewidth=1)
    for mark in marks:  # fault tolerance: a group gone (dashed), back (dotted)
        ax.axvline(mark.step, linestyle="--" if mark.kind == "ft-left" else ":", linewidth=1,
                   color=MARK_COLORS.get(mark.kind, "#666666"))
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()

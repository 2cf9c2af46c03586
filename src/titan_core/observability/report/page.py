"""The report page: one HTML file with everything inline (styles, SVG charts, the PNG), no script.

Every text that comes from a run folder (names, settings, paths) is escaped: the page
shows what a file says, it never runs it.
"""

from __future__ import annotations

import base64
import math
from html import escape

from ..final_loss import FINAL_LOSS_WINDOW, final_loss
from .heatmap import heatmaps
from .runs import RunData, config_differences
from .svg import Mark, Series, color_of, line_chart

# (chart id, title, metric keys tried in order per run, scale, note when no run has it)
CHARTS: list[tuple[str, str, tuple[str, ...], float, str]] = [
    ("loss", "Training loss", ("loss",), 1.0, "no loss recorded"),
    ("val_loss", "Validation loss", ("val_loss",), 1.0, "no validation: enable it with --validation.enable=true"),
    ("lr", "Learning rate", ("lr",), 1.0, "no learning rate recorded"),
    ("grad_norm", "Gradient norm", ("grad_norm",), 1.0, "no gradient norm recorded"),
    ("tokens_per_s", "Tokens/s (all devices)", ("tokens_per_s_total", "tokens_per_s"), 1.0, "no throughput recorded"),
    ("mfu", "MFU (%)", ("mfu",), 100.0, "no MFU: the device's peak is unknown (set --metrics.peak_tflops)"),
    ("memory", "Memory (GiB): CUDA max allocated, else peak RSS", ("mem_max_allocated_gib", "mem_peak_rss_gib"),
     1.0, "no memory recorded"),
]

STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;background:#fafafa}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:24px 0 8px}
table{border-collapse:collapse;font-size:13px;background:#fff} td,th{border:1px solid #ddd;padding:4px 8px;text-align:left}
.charts{display:flex;flex-wrap:wrap;gap:16px} figure{margin:0;background:#fff;border:1px solid #e4e4e4;padding:8px}
figcaption{font-weight:600;font-size:14px;margin-bottom:4px} .swatch{display:inline-block;width:14px;height:3px;
vertical-align:middle;margin-right:6px} .note{color:#666;font-size:13px} pre{font-size:12px;background:#fff;
border:1px solid #e4e4e4;padding:8px;overflow:auto;max-height:400px} img{max-width:100%;border:1px solid #e4e4e4}
"""


def _fmt(value: float | None, spec: str = ".4g") -> str:
    return "–" if value is None or not math.isfinite(value) else format(value, spec)


def _final(run: RunData) -> str:
    """The mean of the last logged losses (one logged step is one batch: noise), and the last one itself."""
    ending = final_loss([y for _, y in run.series.get("loss", []) if math.isfinite(y)])
    if ending is None:
        return "–"
    if ending.count <= 1:
        return _fmt(ending.last)
    return f"{_fmt(ending.mean)} (last: {_fmt(ending.last)})"


def _summary(runs: list[RunData]) -> str:
    rows = ["<tr><th>run</th><th>folder</th><th>last step</th>"
            f"<th>final loss (mean of the last {FINAL_LOSS_WINDOW} logged)</th><th>last validation loss</th>"
            "<th>tokens seen</th><th>tokens/s (last)</th><th>notes</th></tr>"]
    for i, run in enumerate(runs):
        color, _ = color_of(i)
        steps = [x for x, _ in run.series.get("loss", [])]
        notes = []
        if run.skipped_lines:
            notes.append(f"{run.skipped_lines} unreadable lines of metrics.jsonl skipped")
        if run.config_note:
            notes.append(f"settings not shown: {run.config_note}")
        if run.superseded_note:
            notes.append(run.superseded_note)
        nonfinite = sum(1 for _, y in run.series.get("loss", []) if not math.isfinite(y))
        if nonfinite:
            notes.append(f"{nonfinite} non-finite losses (gaps in the lines)")
        spikes = [int(x) for x, y in run.series.get("spike_skipped", []) if y]
        if spikes:  # [stability] spike_guard: updates skipped
            shown = ", ".join(str(s) for s in spikes[:10]) + (", ..." if len(spikes) > 10 else "")
            notes.append(f"{len(spikes)} loss spike{'s' if len(spikes) > 1 else ''} skipped by the guard (step {shown})")
        rollbacks = [int(x) for x, y in run.series.get("spike_rollback", []) if y]
        if rollbacks:  # [stability] spike_rollback: the steps that rolled back to the newest checkpoint
            notes.append(f"rolled back to a checkpoint after repeated spikes at step {', '.join(map(str, rollbacks))}")
        tps = run.last("tokens_per_s_total") or run.last("tokens_per_s")
        rows.append(
            f'<tr><td><span class="swatch" style="background:{color}"></span>{escape(run.name)}</td>'
            f"<td>{escape(str(run.path))}</td><td>{_fmt(steps[-1] if steps else None, '.0f')}</td>"
            f"<td>{_final(run)}</td><td>{_fmt(run.last('val_loss'))}</td>"
            f"<td>{_fmt(run.last('tokens_seen'), ',.0f')}</td><td>{_fmt(tps, ',.0f')}</td>"
            f"<td>{escape('; '.join(notes))}</td></tr>")
    return f"<table>{''.join(rows)}</table>"


def _differences(runs: list[RunData]) -> str:
    if len(runs) < 2:
        return ""
    rows = config_differences(runs)
    if not rows:
        return "<h2>Settings that differ</h2><p class=\"note\">none: every run has the same config.toml settings</p>"
    head = "<tr><th>setting</th>" + "".join(f"<th>{escape(r.name)}</th>" for r in runs) + "</tr>"
    body = "".join("<tr><td>" + escape(key) + "</td>" + "".join(
        f"<td>{escape(v) if v is not None else '<i>unset</i>'}</td>" for v in values) + "</tr>" for key, values in rows)
    return f"<h2>Settings that differ</h2><table>{head}{body}</table>"


def eval_charts(runs: list[RunData]) -> list[tuple[str, str, tuple[str, ...], float, str]]:
    """One chart per ``[eval]`` task any run recorded: its accuracy (multiple choice) or perplexity."""
    charts: list[tuple[str, str, tuple[str, ...], float, str]] = []
    for metric in sorted({k for run in runs for k in run.series if k.startswith("eval/")}):
        task, _, figure = metric.removeprefix("eval/").rpartition("/")
        if figure in ("acc", "ppl"):
            what = "accuracy" if figure == "acc" else "perplexity"
            charts.append((f"eval-{task}-{figure}", f"Eval {task}: {what}", (metric,), 1.0, "no evaluation recorded"))
    return charts


def stability_charts(runs: list[RunData]) -> list[tuple[str, str, tuple[str, ...], float, str]]:
    """The z-loss's chart when a run logged one ([stability] z_loss); nothing, not a note, otherwise."""
    if not any(run.series.get("z_loss") for run in runs):
        return []
    return [("z_loss", "z-loss (added to the trained loss)", ("z_loss",), 1.0, "no z-loss recorded")]


def spike_marks(runs: list[RunData]) -> list[Mark]:
    """The loss chart's marks: each step whose update the spike guard skipped, and each rollback ([stability])."""
    marks: list[Mark] = []
    for run in runs:
        who = f"{run.name}: " if len(runs) > 1 else ""
        for key, kind, what in (("spike_skipped", "spike-skipped", "loss spike skipped"),
                                ("spike_rollback", "spike-rollback", "rolled back to the newest checkpoint")):
            marks.extend(Mark(x, kind, f"{who}step {x:.0f}: {what}") for x, y in run.series.get(key, [])
                         if y and math.isfinite(x))
    return marks


def _charts(runs: list[RunData], loss_marks: list[Mark]) -> str:
    """The charts with something to draw, then one line per chart without (why it has nothing), not an empty frame."""
    figures, missing = [], []
    for chart_id, title, keys, scale, note in CHARTS + eval_charts(runs) + stability_charts(runs):
        series = []
        for i, run in enumerate(runs):
            key = next((k for k in keys if run.series.get(k)), None)
            if key is not None:
                color, dashed = color_of(i)
                series.append(Series(run.name, [(x, y * scale) for x, y in run.series[key]], color, dashed,
                                     tuple(run.breaks)))
        if not any(math.isfinite(x) and math.isfinite(y) for s in series for x, y in s.points):
            if series:  # recorded, but nothing a chart can draw
                note = "every recorded value is non-finite or too large to draw"
            missing.append(f'<li class="not-drawn" data-metric="{escape(chart_id)}"><b>{escape(title)}</b>: '
                           f'not drawn, {escape(note)}</li>')
            continue
        marks = spike_marks(runs) + loss_marks if chart_id == "loss" else []
        figures.append(f'<figure><figcaption>{escape(title)}</figcaption>'
                       f'{line_chart(chart_id, title, series, empty_note=note, marks=marks)}</figure>')
    absent = f'<ul class="note">{"".join(missing)}</ul>' if missing else ""
    return f'<div class="charts">{"".join(figures)}</div>{absent}'


def _settings(runs: list[RunData]) -> str:
    blocks = []
    for run in runs:
        text = "\n".join(f"{k} = {v}" for k, v in sorted(run.settings.items())) or run.config_note
        blocks.append(f"<details><summary>{escape(run.name)}: every setting</summary><pre>{escape(text)}</pre></details>")
    return "<h2>Settings</h2>" + "".join(blocks)


def _fault_tolerance(sections: list[tuple[str, list[str]]]) -> str:
    """One list per fault-tolerance run: a line per failure (from its supervisor's ft_events.jsonl)."""
    blocks = []
    for folder, lines in sections:
        items = "".join(f'<li class="ft-event">{escape(line)}</li>' for line in lines)
        blocks.append(f'<p class="note">{escape(folder)}: each group is one line on the charts; on the loss chart '
                      f'a red dashed line marks the first step trained without a group, a green dotted one its '
                      f'rejoin</p><ul class="ft-events">{items}</ul>')
    return "<h2>Fault tolerance</h2>" + "".join(blocks) if blocks else ""


def render(runs: list[RunData], *, png: bytes | None, png_name: str | None, png_note: str, generated: str,
           loss_marks: list[Mark] | None = None, ft_sections: list[tuple[str, list[str]]] | None = None) -> str:
    """The whole page as one string (``loss_marks`` and ``ft_sections``: what fault-tolerance runs add)."""
    title = "titan report: " + ", ".join(r.name for r in runs)
    if png is not None:
        picture = (f'<img alt="loss against steps" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
                   f'<p class="note">also saved as {escape(png_name or "")}</p>')
    else:
        picture = f'<p class="note">{escape(png_note)}</p>'
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>"
        f"<h1>{escape(title)}</h1><p class=\"note\">written {escape(generated)} by titan-report</p>"
        f"<h2>Runs</h2>{_summary(runs)}{_fault_tolerance(ft_sections or [])}{_differences(runs)}"
        f"<h2>Against steps</h2>{_charts(runs, loss_marks or [])}{heatmaps(runs)}"
        f"<h2>Loss (PNG)</h2>{picture}{_settings(runs)}</body></html>\n"
    )

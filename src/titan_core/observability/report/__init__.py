"""``titan-report``: a run (or several, overlaid) as one self-contained HTML page plus a PNG of the loss.

The page reads only ``metrics.jsonl`` and ``config.toml`` of each run folder; it needs no
network to open and no script to draw (inline SVG). Every run writes its own report when
training ends (``metrics.report``).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from ...console import progress
from ...runtime.run_files import atomic_write_bytes, atomic_write_text
from .ft_run import expand_runs
from .page import render
from .png import MISSING, loss_png
from .runs import read_run, run_names

REPORT_FILE = "report.html"


@dataclass(frozen=True)
class Written:
    html: Path
    png: Path | None  # None: matplotlib is missing (``note`` says so)
    note: str


def png_path_of(html: Path) -> Path:
    return html.with_name(f"{html.stem}-loss.png")


def write_report(run_dirs: list[Path], out: Path) -> Written:
    """Read every run, write ``out`` and the loss PNG beside it (atomically); ConfigError for a bad run folder."""

    # A fault-tolerance run folder is drawn as its replica groups, with its supervisor's failures marked.
    expanded = expand_runs(run_dirs, run_names(run_dirs))
    runs = [read_run(path, name=name) for path, name in zip(expanded.paths, expanded.names)]
    for run, breaks in zip(runs, expanded.breaks):
        run.breaks = breaks
    png = loss_png(runs, marks=expanded.marks)
    png_file = png_path_of(out) if png is not None else None
    generated = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    html = render(runs, png=png, png_name=png_file.name if png_file else None, png_note=MISSING, generated=generated,
                  loss_marks=expanded.marks, ft_sections=expanded.sections)
    out.parent.mkdir(parents=True, exist_ok=True)
    if png is not None and png_file is not None:
        atomic_write_bytes(png_file, png)
    atomic_write_text(out, html)
    return Written(out, png_file, "" if png is not None else MISSING)


def write_run_report(run_dir: Path) -> Written:
    """A run folder's own report, ``<run_dir>/report.html`` (what the trainer writes at the end)."""
    return write_report([Path(run_dir)], Path(run_dir) / REPORT_FILE)


def report_at_end(run_dir: Path) -> Path | None:
    """The trainer's last act on rank 0: the run's report, or a warning. Never raises an Exception: the
    run has finished and its checkpoints are saved, and a chart is not worth failing it for."""

    try:
        written = write_run_report(run_dir)
    except Exception as exc:  # noqa: BLE001 - whatever went wrong while drawing, training succeeded
        progress(f"warning: the run's report was not written ({type(exc).__name__}: {exc}); draw it later with "
                 f"titan-report {run_dir}", is_rank0=True)
        return None
    png = f" and {written.png.name}" if written.png is not None else f" (no PNG: {written.note})"
    progress(f"report: {written.html}{png}", is_rank0=True)
    return written.html

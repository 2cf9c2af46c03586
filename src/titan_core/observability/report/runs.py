"""What a report shows of a run folder: its metric records and its settings.

Both files are read as untrusted: a line of ``metrics.jsonl`` that is not a JSON object with
a numeric ``step`` (a run killed mid-write leaves half a line) is skipped and counted, a
record repeated for a step keeps its last value, and a missing or unreadable
``config.toml`` only leaves the settings out.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ...runtime.os_errors import not_a_folder, special_kind
from ...runtime.regular_files import bounded_lines, open_regular, read_record_lines
from ...runtime.run_files import SUPERSEDED_FILE, read_run_config


@dataclass
class RunData:
    name: str
    path: Path
    # metric -> [(step, value)], steps ascending; non-finite values kept (drawn as gaps)
    series: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    settings: dict[str, str] = field(default_factory=dict)  # dotted config key -> its TOML-ish value
    skipped_lines: int = 0
    config_note: str = ""  # why the settings are missing, when they are
    breaks: list[float] = field(default_factory=list)  # steps its lines do not join across (a group away)
    superseded_note: str = ""  # what metrics.superseded.jsonl holds (records a restart moved aside), if any

    def last(self, metric: str) -> float | None:
        points = [v for _, v in self.series.get(metric, []) if math.isfinite(v)]
        return points[-1] if points else None


def _flatten(table: dict[str, Any], prefix: str = "") -> dict[str, str]:
    flat: dict[str, str] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value
    return flat


# Beyond this a value cannot be drawn (the span of two such values overflows a float): it is a gap, as NaN is.
PLOTTABLE = 1e300


def _number(value: object) -> float:
    """A metric value as a float; NaN for what cannot be drawn (a 400-digit integer, 1e308, a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return math.nan
    try:
        number = float(value)
    except OverflowError:
        return math.nan
    return number if abs(number) <= PLOTTABLE else math.nan


def _read_metrics(path: Path) -> tuple[dict[str, dict[float, float]], int]:
    by_metric: dict[str, dict[float, float]] = {}
    skipped = 0
    with open_regular(path) as f:
        for raw in bounded_lines(f):
            try:
                if raw is None:  # longer than any record: not one
                    raise ValueError(raw)
                record = json.loads(raw.decode("utf-8"))
                step = _number(record["step"])
            except (UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError):
                skipped += 1
                continue
            if not isinstance(record, dict) or not math.isfinite(step):
                skipped += 1
                continue
            for key, value in record.items():
                if key != "step" and isinstance(value, int | float) and not isinstance(value, bool):
                    by_metric.setdefault(key, {})[step] = _number(value)
    return by_metric, skipped


def superseded_note(path: Path) -> str:
    """What the records moved aside by a restart are, in words (they are not drawn); "" when there are none."""
    by_start: dict[int, list[float]] = {}
    try:
        lines = read_record_lines(path / SUPERSEDED_FILE)
    except OSError:  # none, or not a regular file (a FIFO there once hung the report)
        return ""
    for raw in lines:
        if raw is None:
            continue
        try:
            record = json.loads(raw.decode("utf-8"))
            step, start = _number(record["step"]), record["superseded_by_run_from_step"]
        except (UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError):
            continue
        if math.isfinite(step) and isinstance(start, int) and not isinstance(start, bool):
            by_start.setdefault(start, []).append(step)
    parts = []
    for start, steps in sorted(by_start.items()):
        n, low, high = len(steps), min(steps), max(steps)
        parts.append(f"{n} record{'s' if n != 1 else ''} of steps {low:.0f}-{high:.0f} moved to {SUPERSEDED_FILE} when "
                     f"the run in this folder started again from step {start} (not drawn)")
    return "; ".join(parts)


def read_run(path: Path, *, name: str | None = None) -> RunData:
    """A run folder's metrics and settings; ConfigError when it is not a run folder."""

    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"{path} {not_a_folder(path)}; give titan run folders (job.run_dir, e.g. runs/quickstart).")
    metrics = path / "metrics.jsonl"
    if os.path.lexists(metrics) and not metrics.is_file():
        raise ConfigError(f"{metrics} is {special_kind(metrics)}, not the file of records a run writes; give the folder a run wrote "
                          f"(job.run_dir), or put its metrics.jsonl back.")
    if not metrics.is_file():
        raise ConfigError(f"{path} has no metrics.jsonl, so it is not a titan run folder (or no step was logged "
                          f"yet); give the folder a run wrote (job.run_dir).")
    by_metric, skipped = _read_metrics(metrics)
    run = RunData(name=name or path.resolve().name, path=path, skipped_lines=skipped)
    run.series = {key: sorted(points.items()) for key, points in by_metric.items()}
    run.superseded_note = superseded_note(path)
    config = path / "config.toml"
    if config.is_file():
        try:
            run.settings = _flatten(read_run_config(config))
        except ConfigError as exc:
            run.config_note = str(exc)
    else:
        run.config_note = f"{config} is missing"
    return run


def run_names(paths: list[Path]) -> list[str]:
    """Each run's folder name, or its whole path where two runs share a name."""
    names = [p.resolve().name for p in paths]
    return [str(p) if names.count(n) > 1 else n for p, n in zip(paths, names)]


# Settings that differ between any two runs by nature, not by choice.
_NOT_A_DIFFERENCE = {"job.run_dir"}


def config_differences(runs: list[RunData]) -> list[tuple[str, list[str | None]]]:
    """(key, each run's value or None) for every setting whose value is not the same in every run."""
    keys = sorted({k for r in runs for k in r.settings} - _NOT_A_DIFFERENCE)
    rows = []
    for key in keys:
        values = [r.settings.get(key) for r in runs]
        if len(set(values)) > 1:
            rows.append((key, values))
    return rows

"""``titan-train --compare-baseline``: both runs, the table, compare.jsonl / compare.png, and its errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from titan_core.commands.compare import LossCurve, baseline_of, format_comparison, relative_gap
from titan_core.plan.resolve import resolve_config

from conftest import assert_user_error, run_cli

SMALL = ["--llama3.n_layers=2", "--training.seq_len=64", "--training.local_batch_size=4"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_compare_float8_against_its_baseline(tmp_path: Path) -> None:
    result = run_cli(*SMALL, f"--job.run_dir={tmp_path}", "--metrics.log_freq=1", "--compare-baseline",
                     "--converters", "float8", "--training.steps=6")
    assert result.code == 0, result.text

    records = [json.loads(line) for line in (tmp_path / "compare.jsonl").read_text().splitlines()]
    assert [(r["run"], r["step"]) for r in records] == [("converted", s) for s in range(1, 7)] + \
        [("baseline", s) for s in range(1, 7)]
    curves = {run: [r["loss"] for r in records if r["run"] == run] for run in ("converted", "baseline")}
    for run, losses in curves.items():  # each run in its own folder, and the records are its losses
        recorded = [json.loads(line)["loss"] for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
        assert recorded == losses, run
    assert curves["converted"] != curves["baseline"]  # float8 really ran in one of them
    assert (tmp_path / "converted" / "conversion_table.json").exists()
    assert not (tmp_path / "baseline" / "conversion_table.json").exists()
    baseline_toml = (tmp_path / "baseline" / "config.toml").read_text()
    assert "[float8]" not in baseline_toml and re.search(r"converters = \[\s*\]", baseline_toml), baseline_toml

    png = (tmp_path / "compare.png").read_bytes()
    assert png[:8] == PNG_MAGIC and len(png) > 10_000, len(png)

    # The printed table: one row per step with both losses and their difference, then the final gap.
    rows = [line.split() for line in result.out.splitlines() if re.match(r"^\s+\d+\s+\d+\.\d{4}\s", line)]
    assert [int(r[0]) for r in rows] == list(range(1, 7))
    for (_step, conv, base, diff), c, b in zip(rows, curves["converted"], curves["baseline"]):
        assert (float(conv), float(base)) == (round(c, 4), round(b, 4))
        assert float(diff) == pytest.approx(c - b, abs=1e-4)
    c, b = curves["converted"][-1], curves["baseline"][-1]
    match = re.search(r"final relative gap \(step 6\): ([+-]\d+\.\d{3})%", result.out)
    assert match, result.out
    assert float(match.group(1)) == pytest.approx(100 * (c - b) / b, abs=1e-3)
    assert abs(float(match.group(1))) < 0.25  # measured: about 0.01%


def test_compare_needs_converters(cli) -> None:
    assert_user_error(cli(*SMALL, "--compare-baseline"),
                      "--compare-baseline compares a run with converters", "no converters were requested",
                      "--converters")


def test_compare_is_single_process_only(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun would set them: the check comes before any process group
    monkeypatch.setenv("RANK", "0")
    assert_user_error(cli(*SMALL, "--converters", "float8", "--compare-baseline"),
                      "supports a single process only", "world size 2")


def test_baseline_config_drops_only_the_converters(tmp_path: Path) -> None:
    pairs = [("model.spec", "llama3"), ("model.converters", "float8,mx"), ("float8.recipe", "rowwise"), ("training.seed", "7"),
             ("training.steps", "9"), ("llama3.n_layers", "2")]
    resolved = resolve_config(config_source=None, override_pairs=pairs)
    base = baseline_of(resolved, tmp_path / "baseline")
    assert base.converters == [] and base.config.model.converters == []
    assert not hasattr(base.config, "float8") and not hasattr(base.config, "mx")
    assert base.config.job.run_dir == str(tmp_path / "baseline")
    same = ("training", "optimizer", "lr_scheduler", "data", "parallelism", "llama3")
    for section in same:
        assert getattr(base.config, section) == getattr(resolved.config, section), section
    assert base.config.training.seed == 7 and base.config.llama3.n_layers == 2


def test_relative_gap_and_table_numbers() -> None:
    assert relative_gap(1.1, 1.0) == pytest.approx(0.1)
    assert relative_gap(4.5, 5.0) == pytest.approx(-0.1)
    text = format_comparison(LossCurve("converted", [1, 2], [2.5, 2.2]), LossCurve("baseline", [1, 2], [2.5, 2.0]))
    assert "     2          2.2000         2.0000     +0.2000" in text
    assert "final relative gap (step 2): +10.000% (converted 2.2000 vs baseline 2.0000)" in text

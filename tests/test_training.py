"""Single-process training: loss falls, determinism, gradient accumulation, metrics files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from titan_core import Trainer
from titan_core.config.resolve import resolve_config

from conftest import run_cli

SMALL = ["training.seq_len=64", "training.local_batch_size=4", "metrics.log_freq=1", "lr_scheduler.warmup_steps=2"]


def train_in_process(tmp_path: Path, *pairs: str) -> list[float]:
    overrides = [tuple(p.split("=", 1)) for p in (*SMALL, f"job.run_dir={tmp_path}", *pairs)]
    resolved = resolve_config(config_source=None, override_pairs=overrides)  # type: ignore[arg-type]
    trainer = Trainer(resolved)
    trainer.setup()
    return trainer.train()


def test_same_seed_gives_bit_identical_losses(tmp_path: Path) -> None:
    a = train_in_process(tmp_path / "a", "training.steps=4", "training.seed=3")
    b = train_in_process(tmp_path / "b", "training.steps=4", "training.seed=3")
    c = train_in_process(tmp_path / "c", "training.steps=4", "training.seed=4")
    assert a == b  # bit-identical, not merely close
    assert a != c


def test_gradient_accumulation_matches_one_big_batch(tmp_path: Path) -> None:
    big = train_in_process(tmp_path / "big", "training.steps=3", "training.local_batch_size=8")
    accum = train_in_process(tmp_path / "acc", "training.steps=3", "training.local_batch_size=2",
                             "training.global_batch_size=8")
    assert len(big) == len(accum) == 3
    for x, y in zip(big, accum):
        assert abs(x - y) <= 1e-5 * abs(x), (big, accum)


def test_validation_loop_records_val_loss(tmp_path: Path) -> None:
    train_in_process(tmp_path, "training.steps=4", "validation.enable=true", "validation.freq=2", "validation.steps=2")
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in records if "val_loss" in r]
    assert [r["step"] for r in val] == [2, 4]
    assert all(0 < r["val_loss"] < 10 for r in val)


@pytest.mark.slow
def test_loss_falls_over_200_steps_via_cli(tmp_path: Path) -> None:
    """The real CLI: 200 debugmodel steps on the built-in corpus end >= 1.5 nats below step 1."""
    result = run_cli("--spec", "llama3", "--flavor", "debugmodel", "--training.steps=200", "--training.seq_len=128",
                     "--metrics.log_freq=10", f"--job.run_dir={tmp_path}")
    assert result.code == 0, result.text
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert steps[0]["step"] == 1 and steps[-1]["step"] == 200
    first, last = steps[0]["loss"], steps[-1]["loss"]
    print(f"loss step 1: {first:.4f}, step 200: {last:.4f}, drop {first - last:.4f}")
    assert first - last >= 1.5
    for key in ("grad_norm", "lr", "tokens_per_s", "step_time_s", "mem_peak_rss_gib"):
        assert steps[-1][key] > 0
    # one console line per logged step, with the fields a user looks for
    lines = [l for l in result.out.splitlines() if l.startswith("step ")]
    assert len(lines) == len(steps)
    assert all(k in lines[-1] for k in ("loss", "grad_norm", "lr", "tok/s", "mem"))
    assert (tmp_path / "config.toml").is_file()
    assert "first step" in result.err  # progress while the first step loads


def test_wandb_offline_logs_the_same_metrics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    losses = train_in_process(tmp_path, "training.steps=2", "metrics.wandb=true", "metrics.wandb_project=titan-test")
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, list((tmp_path / "wandb").iterdir())
    history = list(runs[0].glob("*.wandb"))
    assert history and history[0].stat().st_size > 0
    records = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in records] == losses

"""What a run says and leaves (issue 31, item 4), in this process.

* a resume asked to train to a step its checkpoint has already reached trains nothing, writes nothing
  (config.toml, metrics.jsonl, report unchanged), says so once, and exits 0 (as torchtitan does);
* the start-up lines tell the truth: the mixture and document masking in the data line, the CPU threads
  each rank takes (cores / local ranks, or OMP_NUM_THREADS) in the device line;
* a converter run prints one summary line of its conversion table (``--metrics.conversion_table=full``:
  every row), and emulated float8 says so once.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import torch

from conftest import run_main

TINY = ("--spec", "llama3", "--flavor", "debugmodel", "--llama3.n_layers=1", "--training.seq_len=32",
        "--training.local_batch_size=2", "--metrics.log_freq=1", "--lr_scheduler.warmup_steps=1")


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_resume_with_nothing_to_train_says_so_and_changes_nothing(capsys: pytest.CaptureFixture[str],
                                                                    tmp_path: Path) -> None:
    run = tmp_path / "run"
    first = run_main(capsys, *TINY, f"--job.run_dir={run}", "--training.steps=3", "--checkpoint.enable=true",
                     "--metrics.report=false")
    assert first.code == 0, first.text
    before = snapshot(run)
    for steps in (3, 2):  # the same command again, and a smaller training.steps (the quickstart's example)
        again = run_main(capsys, *TINY, f"--job.run_dir={run}", f"--training.steps={steps}",
                         "--checkpoint.enable=true", "--metrics.report=false")
        assert again.code == 0, again.text
        where = "at" if steps == 3 else "past"
        assert (f"[titan] nothing to train: the run's last checkpoint is at step 3, {where} --training.steps={steps}. "
                f"The run folder {run} is left as it was") in again.err, again.text
        assert "give --training.steps above 3" in again.err
        assert again.text.count("nothing to train") == 1 and "[titan] done" not in again.text
        assert snapshot(run) == before  # config.toml still says steps = 3
    assert "steps = 3" in (run / "config.toml").read_text()


def test_start_up_lines_name_the_mixture_masking_and_threads(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    threads = torch.get_num_threads()
    ran = run_main(capsys, *TINY, f"--job.run_dir={tmp_path / 'run2'}", "--training.steps=1",
                   "--data.mix.code.source=builtin", "--data.mix.code.weight=3",
                   "--data.mix.prose.source=builtin", "--data.mix.prose.weight=1", "--data.document_masking=true",
                   "--metrics.report=false")
    torch.set_num_threads(threads)
    assert ran.code == 0, ran.text
    assert ("data (mixture of 2 sources: code 75% (builtin), prose 25% (builtin), document masking)"
            in ran.err), ran.text
    cores = len(os.sched_getaffinity(0))
    assert (f"{cores} thread{'s' if cores > 1 else ''} per process ({cores} core{'s' if cores > 1 else ''} / 1 rank "
            "on this machine; OMP_NUM_THREADS overrides)") in ran.err, ran.text


def test_threads_follow_omp_num_threads_when_set(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    ran = run_main(capsys, *TINY, f"--job.run_dir={tmp_path / 'run'}", "--training.steps=1", "--metrics.report=false")
    assert ran.code == 0, ran.text
    assert f"{torch.get_num_threads()} thread" in ran.err and "(OMP_NUM_THREADS=1)" in ran.err, ran.text


@pytest.mark.parametrize("setting, full", [((), False), (("--metrics.conversion_table=full",), True)])
def test_a_conversion_table_is_one_line_unless_asked_and_emulation_is_said_once(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, setting: tuple[str, ...], full: bool) -> None:
    ran = run_main(capsys, *TINY, "--converters", "float8", f"--job.run_dir={tmp_path / 'run'}",
                   "--training.steps=1", "--metrics.report=false", *setting)
    assert ran.code == 0, ran.text
    rows = [line for line in ran.text.splitlines() if line.startswith("layers.0.")]
    summary = [line for line in ran.out.splitlines() if "[titan] converted " in line]
    if full:
        assert len(rows) >= 2 and not summary, ran.text
    else:
        assert not rows and len(summary) == 1, ran.text
        assert "float8: " in summary[0] and "every row: conversion_table.json in the run folder" in summary[0]
    assert ran.text.count("matmuls are emulated in float32 on cpu") == 1, ran.text
    assert (tmp_path / "run" / "conversion_table.json").exists()

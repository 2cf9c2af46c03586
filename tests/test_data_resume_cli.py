"""Exact resume through the real CLI on token shards and on a weighted mixture, including a
checkpoint of two data-parallel ranks (FSDP2 x2, gloo) resumed on one process.

The learning rate is constant after warm-up, so a run of 4 steps is the first half of
the run of 8: resuming its checkpoint to 8 steps must give the 8-step run's losses bit for
bit on the same layout. The background prefetch has made batches 5 and 6 by the time the
checkpoint of step 4 is saved; the saved state must be that of step 4's batches. Across
layouts (2 x 2 rows vs 1 x 4) the rows are the same and the losses agree within float32
reduction-order noise.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from titan_core.commands.data_prepare import main as data_main

from conftest import CliResult, run_cli

COMMON = (
    "--spec", "llama3", "--flavor", "debugmodel", "--llama3.n_layers=2", "--training.seq_len=32",
    "--metrics.log_freq=1", "--lr_scheduler.warmup_steps=2", "--lr_scheduler.decay_type=constant",
    "--checkpoint.enable=true", "--checkpoint.interval=4",
)
SINGLE = ("--training.local_batch_size=4",)
FSDP = ("--nproc-per-node", "2", "--parallelism.dp_shard=2", "--training.local_batch_size=2")
LAYOUT_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, ...]]:
    root = tmp_path_factory.mktemp("data")
    with (root / "web.jsonl").open("w") as f:
        for i in range(300):
            f.write(json.dumps({"text": f"page {i}: " + " ".join(f"w{i * j % 97}" for j in range(60))}) + "\n")
    with (root / "code.jsonl").open("w") as f:
        for i in range(200):
            f.write(json.dumps({"text": f"def f{i}(x):\n    return x * {i} + {i % 7}\n"}) + "\n")
    assert data_main(["prepare", str(root / "web.jsonl"), "--tokenizer", "builtin", "--out", str(root / "web"),
                      "--shard-tokens", "5000", "--quiet"]) == 0
    web = f"tokens:{root / 'web'}"
    return {
        "tokens": (f"--data.source={web}",),
        "mixture": (f"--data.mix.web.source={web}", "--data.mix.web.weight=0.7",
                    f"--data.mix.code.source={root / 'code.jsonl'}", "--data.mix.code.weight=0.3"),
    }


def train(run_dir: Path, layout: tuple[str, ...], data: tuple[str, ...], steps: int) -> CliResult:
    result = run_cli(*COMMON, *layout, *data, f"--training.steps={steps}", f"--job.run_dir={run_dir}")
    assert result.code == 0, result.text
    return result


def records(run_dir: Path) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "loss" in record:
            out[int(record["step"])] = record
    return out


@pytest.mark.parametrize("kind", ["tokens", "mixture"])
def test_resume_is_bit_identical_on_one_process_and_a_two_rank_checkpoint_resumes_on_one(
        kind: str, data: dict[str, tuple[str, ...]], tmp_path: Path) -> None:
    flags = data[kind]
    train(tmp_path / "reference", SINGLE, flags, 8)
    reference = records(tmp_path / "reference")
    assert sorted(reference) == list(range(1, 9))
    assert all(r["data_ms"] >= 0 for r in reference.values())
    if kind == "mixture":  # tokens per source: 7 of every 10 rows from web, within one row at every step
        for step, r in reference.items():
            assert r["tokens_seen.web"] + r["tokens_seen.code"] == r["tokens_seen"] == step * 4 * 32
            assert abs(r["tokens_seen.web"] / 32 - 0.7 * step * 4) < 1

    single = tmp_path / "single"
    train(single, SINGLE, flags, 4)
    resumed = train(single, SINGLE, flags, 8)
    assert f"resuming from {single}/checkpoints/step-000004 at step 4" in resumed.text
    got = records(single)
    assert {s: r["loss"] for s, r in got.items()} == {s: r["loss"] for s, r in reference.items()}  # bit for bit
    if kind == "mixture":
        assert all(got[s]["tokens_seen.web"] == reference[s]["tokens_seen.web"] for s in range(1, 9))

    two = tmp_path / "two"
    train(two, FSDP, flags, 4)
    resumed = train(two, SINGLE, flags, 8)
    assert f"resuming from {two}/checkpoints/step-000004 at step 4" in resumed.text
    got = records(two)
    for step in range(1, 9):
        assert abs(got[step]["loss"] - reference[step]["loss"]) <= LAYOUT_TOLERANCE, (step, got[step], reference[step])

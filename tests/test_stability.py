"""[stability] in real runs: the z-loss and the loss-spike guard (train/z_loss.py, train/spike_guard.py).

In process, on the parity tests' tiny model: a run with z-loss logs ``z_loss`` while its ``loss`` stays the
cross-entropy of a run without it (the same figure at step 1), through the chunked and the full-logits
loss. A model that has learned a repetitive corpus is fed one batch of uniformly random tokens: the guard
skips that step, and the weights at the end equal those of a run whose update at that step was skipped by
the older mechanism (skip_nonfinite_steps on a loss made NaN); its window resumes exactly from a
checkpoint. One real 2-process FSDP2 run with z-loss gives the losses, z-losses and gradient norms of one
process, and a run with z-loss reads no device value on a step that does not log.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from test_ema import TinyRun, tiny_run
from test_host_reads import device_reads

from conftest import DEBUG_LLAMA_2_LAYERS, titan

Z = "stability.z_loss=1e-3"
SPIKE_AT, STEPS = 20, 22
GUARD = ("stability.spike_guard=true", "stability.spike_window=8", "stability.spike_min_steps=8",
         "stability.spike_sigmas=20")  # near loss 0 one batch in ten is 6 deviations up: not a spike


def records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_z_loss_run_logs_z_loss_and_its_loss_stays_the_cross_entropy(tmp_path: Path) -> None:
    plain = tiny_run(tmp_path / "plain", "training.steps=2")
    chunked = tiny_run(tmp_path / "chunked", "training.steps=2", Z)
    full = tiny_run(tmp_path / "full", "training.steps=1", Z, "training.chunked_loss=false")
    without, mine, full_logits = records(tmp_path / "plain"), records(tmp_path / "chunked"), records(tmp_path / "full")
    assert mine[0]["loss"] == without[0]["loss"]  # step 1: the same weights, the same cross-entropy, to the bit
    assert "z_loss" not in without[0] and all(r["z_loss"] > 0 for r in mine)
    # the full-logits path (the model's head in its forward) gives the chunked path's figures
    assert full_logits[0]["loss"] == pytest.approx(mine[0]["loss"], rel=1e-6)
    assert full_logits[0]["z_loss"] == pytest.approx(mine[0]["z_loss"], rel=1e-6)
    # logsumexp of a fresh model's logits is near log(vocabulary): z_loss is 1e-3 x its square
    vocab = plain.trainer.model_args.vocab_size
    assert 0.5 < mine[0]["z_loss"] / (1e-3 * torch.tensor(vocab).log().item() ** 2) < 2
    # the z-loss trained: its first update is not the plain run's
    moved = max((chunked.weights[1][k] - plain.weights[1][k]).abs().max().item() for k in plain.weights[1])
    assert moved > 0
    assert full.trainer.z_loss.coeff == 1e-3


def test_the_z_loss_stays_on_the_device_on_steps_that_do_not_log(tmp_path: Path) -> None:
    [reads] = device_reads(tmp_path, "--spec", "llama3", "--flavor", "debugmodel", "--llama3.n_layers=1",
                           "--stability.z_loss=1e-3")  # 10 steps, logging 1, 5 and 10
    assert set(reads["same"]) == {1, 5, 10} and set(reads["lagged"]) <= {1, 5, 10}, reads
    assert [r["step"] for r in records(tmp_path / "run") if r["z_loss"] > 0] == [1, 5, 10]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One sentence over and over: the tiny model learns it within a few steps (loss near 0.05)."""
    path = tmp_path_factory.mktemp("corpus") / "repeated.txt"
    path.write_text("the quick brown fox jumps over the lazy dog while a small cat sleeps under the warm sun\n" * 400)
    return path


def feed(monkeypatch: pytest.MonkeyPatch, *, garbage: set[int], never_seen: set[int] = frozenset(),  # type: ignore[assignment]
         by_step: bool = False) -> None:
    """The run's n-th batch (counted from 1 in this process, across rollbacks; ``by_step``: the batch of step n)
    is uniformly random tokens for n in ``garbage``; batches in ``never_seen`` are drawn and dropped (a run
    that never saw them)."""
    from titan_core import Trainer

    next_batch = Trainer.next_batch

    def fed(self: Any, batches: Any) -> tuple[torch.Tensor, torch.Tensor]:
        while True:
            self.draws = getattr(self, "draws", 0) + 1
            inputs, labels = next_batch(self, batches)
            if self.draws not in never_seen:
                break
        if (self.step + 1 if by_step else self.draws) not in garbage:
            return inputs, labels
        gen = torch.Generator().manual_seed(self.step + 1 if by_step else self.draws)
        vocab = self.model_args.vocab_size
        return torch.randint(0, vocab, inputs.shape, generator=gen), torch.randint(0, vocab, labels.shape, generator=gen)

    monkeypatch.setattr(Trainer, "next_batch", fed)


@pytest.fixture
def garbage_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Step SPIKE_AT trains on uniformly random tokens instead of its batch."""
    feed(monkeypatch, garbage={SPIKE_AT}, by_step=True)


def learned(run_dir: Path, corpus: Path, *pairs: str) -> TinyRun:
    return tiny_run(run_dir, f"data.source={corpus}", "optimizer.lr=3e-3", f"training.steps={STEPS}", *pairs)


@pytest.mark.usefixtures("garbage_batch")
def test_the_spike_guard_skips_a_garbage_batch_and_resumes_its_window_exactly(
        tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from titan_core import Trainer
    from titan_core.checkpoint.identity import read_record
    from titan_core.checkpoint.tensor_index import read_index

    guarded = learned(tmp_path / "guarded", corpus, *GUARD, "checkpoint.enable=true", "checkpoint.interval=8",
                      "checkpoint.keep_latest_k=0")
    logged = records(tmp_path / "guarded")
    assert [r["step"] for r in logged if r.get("spike_skipped")] == [SPIKE_AT]
    assert logged[SPIKE_AT - 1]["loss"] > 5 > 0.5 > max(r["loss"] for r in logged[SPIKE_AT - 9:SPIKE_AT - 1])
    assert logged[-1]["skipped_steps"] == 1
    said = capsys.readouterr().err  # the console's status lines
    lines = [line for line in said.splitlines() if "is a spike" in line]
    assert len(lines) == 1 and lines[0].startswith(f"[titan] step {SPIKE_AT}: loss "), said
    assert "its update is skipped" in lines[0]
    before, after = guarded.weights[SPIKE_AT - 1], guarded.weights[SPIKE_AT]
    assert all(torch.equal(before[k], after[k]) for k in before)  # the update was not applied

    # The reference: the same data, its step-SPIKE_AT update skipped by skip_nonfinite_steps (its loss made NaN).
    global_loss = Trainer.global_loss_on_device

    def nan_at_spike(self: Any, loss: torch.Tensor) -> torch.Tensor:
        value = global_loss(self, loss)
        return value * float("nan") if self.step + 1 == SPIKE_AT else value

    monkeypatch.setattr(Trainer, "global_loss_on_device", nan_at_spike)
    reference = learned(tmp_path / "reference", corpus, "training.skip_nonfinite_steps=true")
    monkeypatch.setattr(Trainer, "global_loss_on_device", global_loss)  # the garbage batch stays in place
    final = guarded.weights[-1]
    assert all(torch.equal(final[k], v) for k, v in reference.weights[-1].items())

    # The window is in each checkpoint as plain floats: the losses of the last 8 accepted steps.
    step16 = tmp_path / "guarded" / "checkpoints" / "step-000016"
    saved = read_index(step16, read_record(step16).files).values["spike_guard.losses"]
    assert saved == [r["loss"] for r in logged[8:16]]
    # A resume from it carries on exactly: the same window and weights at the end.
    resumed = learned(tmp_path / "resumed", corpus, *GUARD, "checkpoint.enable=true", f"checkpoint.resume={step16}")
    assert resumed.trainer.spike_guard.losses == guarded.trainer.spike_guard.losses
    assert all(torch.equal(resumed.weights[-1][k], v) for k, v in final.items())
    assert [r["step"] for r in records(tmp_path / "resumed") if r.get("spike_skipped")] == [SPIKE_AT]


@pytest.mark.slow
def test_fsdp2_with_z_loss_equals_one_process(tmp_path: Path) -> None:
    steps = ("training.steps=3", Z)
    tiny_run(tmp_path / "one", *steps)
    run = titan(tmp_path / "two", *DEBUG_LLAMA_2_LAYERS, *(f"--{p}" for p in steps), "--training.local_batch_size=2",
                "--lr_scheduler.warmup_steps=1", "--metrics.log_freq=1", "--metrics.report=false", "--parallelism.dp_shard=2",
                nproc=2)
    two = run.step_records("fsdp2", 3)
    one = records(tmp_path / "one")
    for key in ("loss", "z_loss", "grad_norm"):
        worst = max(abs(a[key] - b[key]) / abs(b[key]) for a, b in zip(two, one))
        print(f"\nfsdp2 x 2 vs one process, {key}: max relative difference {worst:.2e}")
        assert worst <= 1e-6, (key, worst, [r[key] for r in two], [r[key] for r in one])


def test_three_spikes_in_a_row_roll_back_and_end_as_a_run_that_never_saw_those_batches(
        tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    feed(monkeypatch, garbage={18, 19, 20})
    rolled = learned(tmp_path / "rolled", corpus, *GUARD, "stability.spike_rollback=3", "checkpoint.enable=true",
                     "checkpoint.interval=8", "checkpoint.keep_latest_k=0")
    said = capsys.readouterr().err
    logged = records(tmp_path / "rolled")
    # steps 1-20 (18, 19 and 20 skipped as spikes; the third rolls back to step 16), then 17-22 on batches 21-26
    assert [r["step"] for r in logged] == [*range(1, 21), *range(17, 23)]
    assert [r["step"] for r in logged if r.get("spike_skipped")] == [18, 19, 20]
    assert [r["step"] for r in logged if r.get("spike_rollback")] == [20]
    assert said.count("is a spike") == 3, said
    assert ("[titan] step 20: 3 spikes in a row: rolled back to the checkpoint of step 16; the data of steps 17 to 20 "
            "is skipped ([stability] spike_rollback)") in said, said
    assert rolled.trainer.step == STEPS and len(rolled.weights) == STEPS + 4 + 1
    # titan-report keeps a step's last record: the second pass's steps 18-20 do not unmark the spikes
    from titan_core.observability.report import write_run_report

    html = write_run_report(tmp_path / "rolled").html.read_text()
    assert "3 loss spikes skipped by the guard (step 18, 19, 20)" in html
    assert "rolled back to a checkpoint after repeated spikes at step 20" in html
    # and marks the loss curve at each skipped spike and at the rollback
    marks = re.findall(r'<line class="mark" data-kind="([\w-]+)" data-step="(\d+)"', html)
    assert marks == [("spike-skipped", "18"), ("spike-skipped", "19"), ("spike-skipped", "20"), ("spike-rollback", "20")]

    # The reference never sees batches 17-20 (17 was a good one: the rollback skips all the data since step 16).
    monkeypatch.undo()
    feed(monkeypatch, garbage=set(), never_seen={17, 18, 19, 20})
    reference = learned(tmp_path / "reference", corpus)
    assert all(torch.equal(rolled.weights[-1][k], v) for k, v in reference.weights[-1].items())

"""Validation under pipeline parallelism runs the held-out batches through every stage.

One process, PP 2 and PP 2 x FSDP 2 train the same 2-layer debug model on the same
global batch and validate after steps 2 and 3: each layout's validation loss must
equal the single process's (the weights match, so the held-out loss must too).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import Run, titan

TOLERANCE = 1e-5
GLOBAL_BATCH = 4
COMMON = (
    "--spec", "llama3", "--flavor", "debugmodel", "--llama3.n_layers=2", "--training.seq_len=32",
    "--training.steps=3", "--lr_scheduler.warmup_steps=1", "--training.seed=0", "--metrics.log_freq=1",
    "--validation.enable=true", "--validation.freq=2", "--validation.steps=2",
)


def _validation_losses(run: Run) -> dict[int, float]:
    assert run.code == 0, run.text
    assert "Traceback" not in run.text, run.text
    return {int(r["step"]): r["val_loss"] for r in run.all_records() if "val_loss" in r}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    run = titan(tmp_path_factory.mktemp("single"), *COMMON, f"--training.local_batch_size={GLOBAL_BATCH}")
    losses = _validation_losses(run)
    assert sorted(losses) == [2, 3]  # every freq steps and at the last step
    assert losses[2] != losses[3]  # the model changed in between: a stale figure would not match
    return losses


@pytest.mark.parametrize(
    ("nproc", "local_batch", "layout"),
    [
        pytest.param(2, GLOBAL_BATCH, ("--parallelism.pp=2",), id="pp2"),
        pytest.param(4, GLOBAL_BATCH // 2, ("--parallelism.pp=2", "--parallelism.dp_shard=2"), id="pp2_fsdp2"),
    ],
)
def test_pipeline_validation_loss_equals_single_process(
    nproc: int, local_batch: int, layout: tuple[str, ...], reference: dict[int, float], tmp_path: Path
) -> None:
    run = titan(tmp_path / "run", *COMMON, f"--training.local_batch_size={local_batch}", *layout, nproc=nproc)
    losses = _validation_losses(run)
    assert sorted(losses) == sorted(reference), run.out
    for step, loss in losses.items():
        assert abs(loss - reference[step]) <= TOLERANCE * reference[step], (step, losses, reference)
    # one console line per validation, from rank 0 only
    assert run.out.count("validation loss") == 2, run.out

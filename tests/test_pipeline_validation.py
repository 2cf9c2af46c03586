"""Pipeline parallelism with document masking, and validation as a loss per valid token.

One process, PP 2 and PP 2 x FSDP 2 train the same 2-layer debug model on the same
global batch, with ``data.document_masking=true`` on a corpus of short documents of very
uneven length, and validate after steps 2 and 3. Masking ignores the label at every
document end, so the two data-parallel ranks of PP 2 x FSDP 2 hold different numbers of
valid labels in their held-out batches. Each layout's training and validation losses must
equal the single process's: the positions reach the second stage (else its attention
would cross documents and RoPE would not restart), and validation divides the summed
token losses by the valid labels of every batch on every rank (a mean of per-batch or
per-rank means would differ).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from titan_core import IGNORE_INDEX, build_dataloader, build_tokenizer, split_documents

from conftest import (
    DEBUG_LLAMA_2_LAYERS,
    PARITY_GLOBAL_BATCH,
    PARITY_SEQ_LEN,
    PARITY_TOLERANCE,
    Run,
    titan,
    write_uneven_corpus,
)

TOLERANCE = PARITY_TOLERANCE
GLOBAL_BATCH = PARITY_GLOBAL_BATCH
SEQ_LEN = PARITY_SEQ_LEN
VAL_STEPS = 2
COMMON = (
    *DEBUG_LLAMA_2_LAYERS,
    "--training.steps=3", "--lr_scheduler.warmup_steps=1", "--training.seed=0", "--metrics.log_freq=1",
    "--validation.enable=true", "--validation.freq=2", f"--validation.steps={VAL_STEPS}",
    "--data.document_masking=true",
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Short documents of very uneven length: windows hold from none to many document ends."""
    return write_uneven_corpus(tmp_path_factory.mktemp("corpus") / "docs.jsonl", seed=1, documents=1500,
                               longest=40)


def _run(tmp: Path, corpus: Path, *args: str, nproc: int | None = None) -> Run:
    return titan(tmp, *COMMON, f"--data.source={corpus}", *args, nproc=nproc)


def _losses(run: Run) -> tuple[dict[int, float], dict[int, float]]:
    """(training loss, validation loss) per step."""
    assert run.code == 0, run.text
    assert "Traceback" not in run.text, run.text
    records = run.all_records()
    return ({int(r["step"]): r["loss"] for r in records if "loss" in r},
            {int(r["step"]): r["val_loss"] for r in records if "val_loss" in r})


def test_held_out_batches_give_the_two_ranks_uneven_valid_labels(corpus: Path) -> None:
    """The premise of the parity below: per rank and per batch, the valid labels differ."""
    tok = build_tokenizer("builtin")
    valid = []
    for rank in range(2):
        loader = build_dataloader(source=str(corpus), tokenizer=tok, seq_len=SEQ_LEN, local_batch_size=2,
                                  dp_rank=rank, dp_world_size=2, seed=0, split="validation")
        for inputs, labels in (next(loader) for _ in range(VAL_STEPS)):
            _, masked = split_documents(inputs, labels, eos_id=tok.eos_id, bos_id=tok.bos_id)
            valid.append(int((masked != IGNORE_INDEX).sum()))
    assert len(set(valid)) == len(valid), valid  # 4 different counts: no two means weigh alike


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, corpus: Path) -> tuple[dict[int, float], dict[int, float]]:
    train, val = _losses(_run(tmp_path_factory.mktemp("single"), corpus, f"--training.local_batch_size={GLOBAL_BATCH}"))
    assert sorted(train) == [1, 2, 3] and sorted(val) == [2, 3]  # every freq steps and at the last step
    assert val[2] != val[3]  # the model changed in between: a stale figure would not match
    return train, val


@pytest.mark.parametrize(
    ("nproc", "local_batch", "layout"),
    [
        pytest.param(2, GLOBAL_BATCH, ("--parallelism.pp=2",), id="pp2"),
        pytest.param(4, GLOBAL_BATCH // 2, ("--parallelism.pp=2", "--parallelism.dp_shard=2"), id="pp2_fsdp2"),
    ],
)
def test_masked_pipeline_training_and_validation_losses_equal_single_process(
    nproc: int, local_batch: int, layout: tuple[str, ...], corpus: Path,
    reference: tuple[dict[int, float], dict[int, float]], tmp_path: Path
) -> None:
    run = _run(tmp_path / "run", corpus, f"--training.local_batch_size={local_batch}", *layout, nproc=nproc)
    for name, losses, expected in zip(("training", "validation"), _losses(run), reference):
        assert sorted(losses) == sorted(expected), (name, run.out)
        for step, loss in losses.items():
            assert abs(loss - expected[step]) <= TOLERANCE * expected[step], (name, step, losses, expected)
    # one console line per validation, from rank 0 only
    assert run.out.count("validation loss") == 2, run.out

"""The loss per valid token (token_loss.py) and the refusals of data.document_masking.

The parity runs train the llama3 debug model (2 layers) for one SGD step with
document masking on a corpus of short documents of uneven length, so the two
data-parallel ranks (and the accumulation micro-batches) get different numbers of
ignored labels. The gradients of one process on the whole batch (full logits), of FSDP2
and of TP on two real gloo processes, and of four accumulation micro-batches (these three
with the chunked loss) must agree: with a
learning rate of 1000 the exported weights are ``w0 - 1000 * grad``, dominated by the
gradient, and must match to 1e-6 relative (norm of the difference over norm).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from titan_core import IGNORE_INDEX, build_dataloader, build_tokenizer, split_documents
from titan_core.train.token_loss import token_weighted

from conftest import DEBUG_LLAMA_2_LAYERS, PARITY_SEQ_LEN, titan, write_uneven_corpus

SEQ_LEN = PARITY_SEQ_LEN
COMMON = (
    *DEBUG_LLAMA_2_LAYERS,
    "--training.steps=1", "--training.seed=0", "--optimizer.name=SGD", "--optimizer.lr=1000",
    "--optimizer.weight_decay=0", "--lr_scheduler.warmup_steps=0", "--lr_scheduler.decay_type=constant",
    "--training.max_norm=0", "--metrics.log_freq=1", "--data.document_masking=true",
    "--checkpoint.export_at_end=true",
)


def test_all_valid_labels_keep_todays_arithmetic_bit_for_bit() -> None:
    mean = torch.tensor(3.7654321)
    for accum, dp in ((1, 1), (2, 2), (3, 1), (5, 4)):
        tokens = 8 * 32
        weighted = token_weighted(mean, valid=tokens, global_valid=tokens * accum * dp, dp=dp)
        assert torch.equal(weighted, mean / accum)
        # A pipeline microbatch of a quarter of the rows, its gradients later divided by 4.
        assert torch.equal(token_weighted(mean, valid=tokens // 4, global_valid=tokens * accum * dp, dp=dp, splits=4),
                           mean / accum)


def test_uneven_micro_batches_weigh_every_token_the_same() -> None:
    logits = torch.randn(2, 6, 11, generator=torch.Generator().manual_seed(0), requires_grad=True)
    labels = torch.randint(0, 11, (2, 6), generator=torch.Generator().manual_seed(1))
    labels[0, :5] = IGNORE_INDEX  # micro-batch 0: 1 valid label; micro-batch 1: 6
    loss_fn = torch.nn.functional.cross_entropy
    total = sum(token_weighted(loss_fn(logits[i], labels[i]), valid=int((labels[i] != IGNORE_INDEX).sum()),
                               global_valid=7, dp=1) for i in range(2))
    expected = loss_fn(logits.flatten(0, 1), labels.flatten(), reduction="sum") / 7
    torch.testing.assert_close(total, expected)
    # A micro-batch without a valid label adds exactly zero, gradients included (its mean is 0/0).
    empty = token_weighted(loss_fn(logits[0], torch.full((6,), IGNORE_INDEX)), valid=0, global_valid=7, dp=1)
    empty.backward()
    assert empty.item() == 0.0 and logits.grad is not None and not logits.grad.abs().any()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Short documents of very uneven length: windows hold from none to many document ends."""
    return write_uneven_corpus(tmp_path_factory.mktemp("corpus") / "docs.jsonl", seed=0, documents=300,
                               longest=50)


def _ignored_per_rank(corpus: Path) -> list[int]:
    """Ignored labels each of 2 data-parallel ranks gets in the first batch (as the trainer splits them)."""
    tok = build_tokenizer("builtin")
    counts = []
    for rank in range(2):
        loader = build_dataloader(source=str(corpus), tokenizer=tok, seq_len=SEQ_LEN, local_batch_size=2,
                                  dp_rank=rank, dp_world_size=2, seed=0)
        inputs, labels = next(iter(loader))
        _, masked = split_documents(inputs, labels, eos_id=tok.eos_id, bos_id=tok.bos_id)
        counts.append(int((masked == IGNORE_INDEX).sum()))
    return counts


def _weights_and_loss(tmp: Path, corpus: Path, *args: str, nproc: int | None = None) -> tuple[torch.Tensor, float]:
    run = titan(tmp, *COMMON, f"--data.source={corpus}", *args, nproc=nproc)
    assert run.code == 0, run.text
    weights = load_file(str(tmp / "export" / "model.safetensors"))
    flat = torch.cat([weights[name].flatten().double() for name in sorted(weights)])
    return flat, run.records()[0]["loss"]


def test_fsdp2_tp_and_accumulation_match_one_process_with_uneven_ignored_labels(tmp_path: Path, corpus: Path) -> None:
    counts = _ignored_per_rank(corpus)
    assert counts[0] != counts[1] and min(counts) >= 1, counts  # uneven, so a mean of means would differ
    # The reference holds the full logits; the other layouts take the loss in chunks of 16 tokens
    # (chunked_loss.py), under FSDP2, under TP with loss parallel, and per accumulation micro-batch.
    reference, ref_loss = _weights_and_loss(tmp_path / "single", corpus, "--training.local_batch_size=4",
                                            "--training.chunked_loss=false")
    chunks = "--training.loss_chunk_tokens=16"
    layouts = {
        "fsdp2": _weights_and_loss(tmp_path / "fsdp2", corpus, "--training.local_batch_size=2",
                                   "--parallelism.dp_shard=2", chunks, nproc=2),
        "accumulation x4": _weights_and_loss(tmp_path / "accum", corpus, "--training.local_batch_size=1",
                                             "--training.global_batch_size=4", chunks),
        "tp2": _weights_and_loss(tmp_path / "tp2", corpus, "--training.local_batch_size=4", "--parallelism.tp=2",
                                 chunks, nproc=2),
    }
    for name, (weights, loss) in layouts.items():
        rel = float((weights - reference).norm() / reference.norm())
        print(f"{name}: gradient relative difference {rel:.2e}, loss {loss} vs {ref_loss}")
        assert rel < 1e-6, (name, rel)
        assert abs(loss - ref_loss) <= 1e-6 * ref_loss, (name, loss, ref_loss)
    # The masking was really applied: without it the same batch has another loss.
    run = titan(tmp_path / "unmasked", *[a for a in COMMON if "document_masking" not in a], f"--data.source={corpus}",
                "--training.local_batch_size=4")
    assert run.code == 0, run.text
    assert abs(run.records()[0]["loss"] - ref_loss) > 1e-3, (run.records()[0]["loss"], ref_loss)


def test_masking_is_refused_for_a_model_that_does_not_accept_positions(tmp_path: Path) -> None:
    run = titan(tmp_path, "--import", "titan_core.testing.tiny_spec", "--spec", "tiny",
                "--data.document_masking=true", "--dry-run")
    assert run.code == 2, run.text
    assert 'data.document_masking=true: the model of spec "tiny"' in run.err
    assert "does not accept the `positions` keyword argument" in run.err
    assert "Traceback" not in run.err


def test_masking_is_refused_with_a_pipeline_that_does_not_carry_positions(tmp_path: Path) -> None:
    """titan-llama's pipeline carries them (tests/test_pipeline_validation.py); a spec whose pipeline does not
    declare it is refused before anything runs."""
    run = titan(tmp_path, "--import", "tests._positionless_pipeline_spec", "--spec", "llama3-positionless-pp",
                "--flavor", "debugmodel", "--parallelism.pp=2", "--data.document_masking=true", "--training.steps=1",
                nproc=2)
    assert run.code == 2, run.text
    assert ("data.document_masking=true is not supported with pipeline parallelism (parallelism.pp=2) by spec "
            '"llama3-positionless-pp"') in run.err
    assert "TrainSpec.pipeline_takes_positions" in run.err
    assert run.err.count("error") == 1 and "Traceback" not in run.err, run.err
    assert not (tmp_path / "metrics.jsonl").exists()

"""Tied embeddings as part of the model contract: declared by the model, kept by the core.

Checks the published Llama 3.2 parameter counts, that to_empty breaks a tie and the
core mends it, that a broken tie is reported with the step that broke it, and that a
tied model trains the same on one process, FSDP2 x2 and TP 2 and resumes bit-exactly.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hf"))
from titan_core import PluginError, check_ties, retie_weights
from titan_llama.flavors import llama3_flavors
from titan_llama.model import Transformer

from hf_helpers import GLOBAL_BATCH, titan  # noqa: E402

TIED = ("--flavor", "debugmodel_tied", "--llama3.n_layers=2", "--training.steps=3")


@pytest.mark.parametrize("flavor, published", [("1B", 1_235_814_400), ("3B", 3_212_749_824)])
def test_llama32_flavors_have_the_published_parameter_counts(flavor: str, published: int) -> None:
    with torch.device("meta"):
        model = Transformer(llama3_flavors[flavor])
    assert model.output.weight is model.tok_embeddings.weight
    assert sum(p.numel() for p in model.parameters()) == published


def test_untied_1b_keeps_its_own_head() -> None:
    args = dataclasses.replace(llama3_flavors["1B_untied"], vocab_size=128256)
    with torch.device("meta"):
        model = Transformer(args)
    assert model.tied_weights() == []
    # 1B's count plus the separate 128256 x 2048 head, with the 1.5x-rule MLP (8192 wide).
    assert sum(p.numel() for p in model.parameters()) == 1_235_814_400 + 128256 * 2048


def test_to_empty_unties_and_the_core_reties() -> None:
    args = dataclasses.replace(llama3_flavors["debugmodel_tied"], vocab_size=64, n_layers=1)
    with torch.device("meta"):
        model = Transformer(args)
    ties = model.tied_weights()
    check_ties([model], ties, after="meta build")
    model.to_empty(device="cpu")
    assert model.output.weight is not model.tok_embeddings.weight  # what torch does
    with pytest.raises(PluginError, match=r"tok_embeddings.weight and output.weight are two tensors after to_empty"):
        check_ties([model], ties, after="to_empty")
    assert retie_weights(model) == 1
    check_ties([model], ties, after="retie")
    assert model.output.weight is model.tok_embeddings.weight


def test_tied_model_trains_the_same_on_fsdp2_and_tp_and_resumes_exactly(tmp_path: Path) -> None:
    from conftest import trained

    common = ("model.flavor=debugmodel_tied", "llama3.n_layers=2", "training.seq_len=32",
              f"training.local_batch_size={GLOBAL_BATCH}", "lr_scheduler.warmup_steps=1")
    trainer, reference = trained(tmp_path / "one", *common, "training.steps=3")
    model = trainer.model_parts[0]
    assert model.output.weight is model.tok_embeddings.weight
    assert trainer.n_params == sum(p.numel() for p in model.parameters())  # the tied table counted once

    fsdp = titan(tmp_path / "fsdp", *TIED, "--parallelism.dp_shard=2", f"--training.local_batch_size={GLOBAL_BATCH // 2}",
                 nproc=2)
    assert fsdp.code == 0, fsdp.text
    tp = titan(tmp_path / "tp", *TIED, "--parallelism.dp_shard=1", "--parallelism.tp=2",
               f"--training.local_batch_size={GLOBAL_BATCH}", nproc=2)
    assert tp.code == 0, tp.text
    for run in (fsdp, tp):
        assert run.losses() == pytest.approx(reference, rel=1e-5, abs=0)

    # Checkpoint at step 2, resume to step 3: the tie holds and the loss is bit-exact.
    ckpt = ("checkpoint.enable=true", "checkpoint.interval=2")
    trained(tmp_path / "ckpt", *common, *ckpt, "training.steps=2")
    resumed, tail = trained(tmp_path / "ckpt", *common, *ckpt, "training.steps=3")
    model = resumed.model_parts[0]
    assert model.output.weight is model.tok_embeddings.weight
    assert tail == [reference[2]]


def test_tied_model_refuses_pipeline_parallelism(tmp_path: Path) -> None:
    from conftest import assert_user_error, run_cli

    result = run_cli("--flavor", "debugmodel_tied", "--parallelism.pp=2", "--parallelism.dp_shard=1",
                     "--nproc-per-node", "2", "--dry-run")
    assert_user_error(result, "ties its output head to its embedding", "parallelism.pp=2")

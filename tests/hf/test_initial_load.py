"""``--checkpoint.initial_load``: a Hugging Face folder (or a titan checkpoint) as the weights of step 0.

The step-1 loss after loading an HF folder equals transformers' loss on the same batch;
FSDP2 x2, TP 2 and PP 2 loads give the same step-1 loss as one process; the run's own
checkpoints take precedence; flags that contradict config.json and broken folders are
errors with one message.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_user_error, trained
from hf_helpers import GLOBAL_BATCH, tiny_hf_llama, titan

SMALL = ("training.seq_len=32", f"training.local_batch_size={GLOBAL_BATCH}", "lr_scheduler.warmup_steps=1")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Sharded on purpose (two or more files plus the index), GQA, llama3 RoPE scaling.
    return tiny_hf_llama(tmp_path_factory.mktemp("hf") / "tiny", max_shard_size="300KB")


def first_batch(run_dir: Path, *pairs: str) -> tuple[torch.Tensor, torch.Tensor]:
    from titan_core import Trainer
    from titan_core.plan.resolve import resolve_config

    overrides = [tuple(p.split("=", 1)) for p in ("model.spec=llama3", *SMALL, f"job.run_dir={run_dir}", *pairs)]
    trainer = Trainer(resolve_config(config_source=None, override_pairs=overrides))  # type: ignore[arg-type]
    trainer.init_distributed()
    trainer.build_tokenizer_and_data()
    return next(iter(trainer.dataloader))


def test_step1_loss_equals_transformers_and_every_layout_agrees(hf_dir: Path, tmp_path: Path) -> None:
    from transformers import LlamaForCausalLM

    assert (hf_dir / "model.safetensors.index.json").is_file()
    _, losses = trained(tmp_path / "one", *SMALL, f"checkpoint.initial_load={hf_dir}", "training.steps=2")
    inputs, labels = first_batch(tmp_path / "batch")
    reference = LlamaForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = reference(inputs).logits
    hf_loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten()).item()
    assert losses[0] == pytest.approx(hf_loss, rel=1e-5, abs=0)

    load = (f"--checkpoint.initial_load={hf_dir}", "--training.steps=2")
    layouts = {  # name: (processes, flags)
        "fsdp2": (2, ("--parallelism.dp_shard=2", f"--training.local_batch_size={GLOBAL_BATCH // 2}")),
        "tp2": (2, ("--parallelism.dp_shard=1", "--parallelism.tp=2", f"--training.local_batch_size={GLOBAL_BATCH}")),
        "pp2": (2, ("--parallelism.dp_shard=1", "--parallelism.pp=2", f"--training.local_batch_size={GLOBAL_BATCH}")),
        "hsdp": (4, ("--parallelism.dp_replicate=2", "--parallelism.dp_shard=2",
                     f"--training.local_batch_size={GLOBAL_BATCH // 4}")),
    }
    n_params = sum(p.numel() for p in reference.parameters())
    for name, (nproc, args) in layouts.items():
        run = titan(tmp_path / name, *load, *args, nproc=nproc)
        assert run.code == 0, run.text
        # The log names the shape's source and the model's real size, not a flavor it did not use.
        assert f"model llama3 (shape from {hf_dir}/config.json): {n_params:,} parameters" in run.text
        assert "debugmodel" not in run.text
        assert "initial weights: 21 tensors from" in run.text and "its own slices" in run.text
        assert run.losses() == pytest.approx(losses, rel=1e-5, abs=0), name


def test_the_runs_own_checkpoint_takes_precedence(hf_dir: Path, tmp_path: Path) -> None:
    ckpt = ("checkpoint.enable=true", "checkpoint.interval=2", f"checkpoint.initial_load={hf_dir}")
    _, straight = trained(tmp_path / "straight", *SMALL, *ckpt, "training.steps=3")
    _, first = trained(tmp_path / "run", *SMALL, *ckpt, "training.steps=2")
    trainer, rest = trained(tmp_path / "run", *SMALL, *ckpt, "training.steps=3")
    assert trainer.step == 3 and rest == [straight[2]]  # resumed at 2, not reloaded from the HF folder


def test_a_titan_checkpoint_as_initial_load(tmp_path: Path) -> None:
    shape = ("model.flavor=debugmodel_gqa", "llama3.n_layers=2")
    source, _ = trained(tmp_path / "src", *SMALL, *shape, "checkpoint.enable=true", "training.steps=2")
    step_dir = tmp_path / "src" / "checkpoints" / "step-000002"
    trainer, losses = trained(tmp_path / "dst", *SMALL, *shape, f"checkpoint.initial_load={step_dir}",
                              "training.steps=1")
    assert trainer.step == 1  # step 0 of a new run: the checkpoint's step counter is not taken
    inputs, labels = first_batch(tmp_path / "batch", *shape)
    with torch.no_grad():
        expected = F.cross_entropy(source.model_parts[0](inputs).flatten(0, 1), labels.flatten()).item()
    assert losses[0] == pytest.approx(expected, rel=1e-6, abs=0)


def test_flags_that_contradict_config_json_are_listed_by_the_run_and_the_dry_run(hf_dir: Path, tmp_path: Path,
                                                                                    cli) -> None:
    flags = (f"--checkpoint.initial_load={hf_dir}", f"--job.run_dir={tmp_path}", "--training.steps=1",
             "--llama3.n_layers=3", "--llama3.rope_theta=5.0")
    fragments = ("these settings contradict it", "llama3.n_layers=3 (config.json: 2)",
                 "llama3.rope_theta=5.0 (config.json: 10000.0)")
    errors = []
    for mode in ((), ("--dry-run",)):
        result = cli(*mode, *flags)
        assert_user_error(result, *fragments)
        errors.append([line for line in result.text.splitlines() if "error:" in line])
    assert len(errors[0]) == 1 and errors[0] == errors[1]  # the same one message


def test_dry_run_takes_the_shape_from_config_json(hf_dir: Path, tmp_path: Path, cli) -> None:
    from safetensors import safe_open

    n_params = 0
    for file in hf_dir.glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as handle:
            n_params += sum(math.prod(handle.get_slice(k).get_shape()) for k in handle.keys())
    # debugmodel (the default flavor) has another shape: the count shows which one was built.
    load = ("--dry-run", f"--checkpoint.initial_load={hf_dir}", f"--job.run_dir={tmp_path}")
    result = cli(*load, "--training.seq_len=32", "--llama3.max_seq_len=64")
    assert result.code == 0, result.text
    assert f"model shape from {hf_dir}/config.json (model.flavor is ignored): dim=64, n_layers=2" in result.text
    assert "max_seq_len=64" in result.text  # a runtime field may still be set
    assert f"spec llama3, shape from {hf_dir}/config.json: {n_params:,} parameters" in result.text
    # Validation uses that shape too: config.json's max_position_embeddings (128), not debugmodel's 2048.
    assert_user_error(cli(*load, "--training.seq_len=256"),
                      f"training.seq_len=256 is longer than the model's max_seq_len=128 (spec llama3, shape from "
                      f"{hf_dir}/config.json)")


def test_broken_hf_folders_are_one_message_each(hf_dir: Path, tmp_path: Path, cli) -> None:
    import shutil

    gpt2 = tmp_path / "gpt2"
    shutil.copytree(hf_dir, gpt2)
    config = json.loads((gpt2 / "config.json").read_text())
    (gpt2 / "config.json").write_text(json.dumps({**config, "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))

    no_shard = tmp_path / "no_shard"
    shutil.copytree(hf_dir, no_shard)
    index = json.loads((no_shard / "model.safetensors.index.json").read_text())
    lost = sorted(set(index["weight_map"].values()))[-1]
    (no_shard / lost).unlink()

    wrong_shape = tmp_path / "wrong_shape"
    shutil.copytree(hf_dir, wrong_shape)
    (wrong_shape / "config.json").write_text(json.dumps({**config, "intermediate_size": 128}))

    cases = {
        gpt2: ('describes a "gpt2" model (GPT2LMHeadModel), not a Llama',),
        no_shard: (f"shard {no_shard / lost} is missing", "fetch the missing files again"),
        wrong_shape: ("does not fit the model its config.json describes",
                      "model.layers.0.mlp.down_proj.weight has shape [64, 160] but config.json implies [64, 128]"),
    }
    for folder, fragments in cases.items():
        result = cli(f"--checkpoint.initial_load={folder}", f"--job.run_dir={tmp_path / 'run'}", "--training.steps=1",
                     "--training.seq_len=32")
        assert_user_error(result, *fragments)
        assert result.text.count("error:") == 1

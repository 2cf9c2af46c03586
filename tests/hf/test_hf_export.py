"""``--checkpoint.export_format=hf``: transformers loads the export with no code, bit-exactly.

* HF folder -> titan (lr 0) -> hf export gives bit-identical tensors (fp32), for a sharded
  untied model on one process and a tied model under FSDP2 x2;
* ``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained`` load a trained run's export,
  the tokenizer encodes like titan's, and greedy ``generate`` of 8 tokens equals titan's
  own greedy decode.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from conftest import trained
from hf_helpers import GLOBAL_BATCH, tiny_hf_llama, titan

EXPORT = ("checkpoint.export_at_end=true", "checkpoint.export_format=hf")


def hf_tensors(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(file))
    return out


def test_round_trip_is_bit_identical_sharded_untied(tmp_path: Path) -> None:
    source = tiny_hf_llama(tmp_path / "hf", vocab=2048, max_shard_size="300KB")
    run = tmp_path / "run"
    trained(run, "training.seq_len=32", f"training.local_batch_size={GLOBAL_BATCH}", "training.steps=1",
            "optimizer.lr=0", f"checkpoint.initial_load={source}", *EXPORT, "checkpoint.export_shard_gb=0.0002")
    out = run / "export" / "hf"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) >= 3 and all((out / f).is_file() for f in files)
    original, exported = hf_tensors(source), hf_tensors(out)
    for file in files:  # each file stays under the limit, unless it holds one tensor bigger than it
        names = [n for n, f in index["weight_map"].items() if f == file]
        assert len(names) == 1 or sum(exported[n].numel() * 4 for n in names) <= 200_000, file
    assert sorted(exported) == sorted(original) == sorted(index["weight_map"])
    for name, tensor in original.items():
        assert exported[name].dtype == torch.float32 and torch.equal(exported[name], tensor), name
    config = json.loads((out / "config.json").read_text())
    assert config["intermediate_size"] == 160 and config["num_key_value_heads"] == 2
    assert config["rope_parameters"]["rope_type"] == "llama3" and config["tie_word_embeddings"] is False


def test_round_trip_of_a_tied_model_under_fsdp2(tmp_path: Path) -> None:
    source = tiny_hf_llama(tmp_path / "hf", tied=True, rope_scaling=False)
    run = titan(tmp_path / "run", f"--checkpoint.initial_load={source}", "--optimizer.lr=0", "--training.steps=1",
                "--parallelism.dp_shard=2", f"--training.local_batch_size={GLOBAL_BATCH // 2}",
                *(f"--{p}" for p in EXPORT), nproc=2)
    assert run.code == 0, run.text
    out = tmp_path / "run" / "export" / "hf"
    original, exported = hf_tensors(source), hf_tensors(out)
    assert "lm_head.weight" not in exported and sorted(exported) == sorted(original)
    for name, tensor in original.items():
        assert torch.equal(exported[name], tensor), name
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True


@torch.no_grad()
def greedy(model: torch.nn.Module, ids: list[int], steps: int) -> list[int]:
    """Titan's own greedy decode: the whole sequence each step, argmax of the last logits."""
    tokens = torch.tensor([ids])
    for _ in range(steps):
        nxt = model(tokens)[0, -1].argmax()
        tokens = torch.cat([tokens, nxt.view(1, 1)], dim=1)
    return tokens[0].tolist()


def test_transformers_loads_the_export_and_generates_like_titan(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = tmp_path / "run"
    trainer, _ = trained(run, "model.flavor=debugmodel_tied", "llama3.n_layers=2", "training.seq_len=32",
                         f"training.local_batch_size={GLOBAL_BATCH}", "training.steps=10", *EXPORT)
    out = run / "export" / "hf"
    assert {p.name for p in out.iterdir()} >= {"config.json", "generation_config.json", "model.safetensors",
                                               "tokenizer.json", "tokenizer_config.json", "original"}
    tokenizer = AutoTokenizer.from_pretrained(out)
    text = "The quick brown fox jumps over the lazy dog. def main():\n    return 42  # ünïcode\n"
    ids = tokenizer(text)["input_ids"]
    assert ids == trainer.tokenizer.encode(text, bos=True)
    assert tokenizer.decode(ids, skip_special_tokens=True) == text

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    prompt = ids[:12]
    generated = model.generate(torch.tensor([prompt]), max_new_tokens=8, min_new_tokens=8, do_sample=False,
                               pad_token_id=tokenizer.eos_token_id)[0].tolist()
    ours = greedy(trainer.model_parts[0].eval(), prompt, 8)
    assert len(generated) == len(prompt) + 8
    assert generated == ours

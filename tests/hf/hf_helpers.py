"""Helpers shared by the tied-weight and Hugging Face tests: tiny HF models saved locally,
and titan-train runs in subprocesses whose metrics are read back."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conftest import Run as _Run, run_command, titan_command

REPO = Path(__file__).resolve().parents[2]
# Small runs: 32-token sequences, a global batch of 4, logged every step.
SEQ_LEN = 32
GLOBAL_BATCH = 4
RUN = ("--spec", "llama3", f"--training.seq_len={SEQ_LEN}", "--metrics.log_freq=1",
       "--lr_scheduler.warmup_steps=1", "--training.seed=0")


@dataclass(frozen=True)
class Run(_Run):
    def losses(self) -> list[float]:
        lines = (self.run_dir / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line)["loss"] for line in lines if '"loss"' in line and '"step"' in line]


def run_process(cmd: list[str], *, run_dir: Path, timeout: float = 300) -> Run:
    """Run ``cmd`` in its own process group; the whole group is killed on timeout."""
    done = run_command(cmd, run_dir=run_dir, timeout=timeout)
    return Run(done.code, done.out, done.err, done.run_dir)


def titan(run_dir: Path, *args: str, nproc: int | None = None) -> Run:
    """``python -m titan_core [--nproc-per-node N] RUN... ARGS`` with its run folder."""
    launch = ["--nproc-per-node", str(nproc)] if nproc else []
    return run_process(titan_command(*launch, *RUN, f"--job.run_dir={run_dir}", *args), run_dir=run_dir)


def tiny_hf_llama(folder: Path, *, tied: bool = False, rope_scaling: bool = True, vocab: int = 2048,
                  n_kv_heads: int = 2, seed: int = 0, max_shard_size: str | None = None, **overrides: Any) -> Path:
    """A random ``LlamaForCausalLM`` saved with ``save_pretrained`` (the stand-in for a download)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16} if rope_scaling else None
    kwargs: dict[str, Any] = dict(
        vocab_size=vocab, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=n_kv_heads, rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=scaling,
        tie_word_embeddings=tied, max_position_embeddings=128, bos_token_id=vocab - 10, eos_token_id=vocab - 9,
    )
    kwargs.update(overrides)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**kwargs)).float().eval()
    with torch.no_grad():  # norms away from 1, so a wrong norm mapping shows in the logits
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    save_kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(folder, **save_kwargs)
    return folder

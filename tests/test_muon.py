"""Muon (optim/muon.py): Muon for the hidden-state matrices, AdamW for the rest, in one optimizer.

Units: the Newton-Schulz iteration's singular values, which parameters Muon takes (from the
model's structure), a Muon step against the formula by hand, the AdamW groups against torch's
AdamW. End to end: a resumed run repeats the uninterrupted one bit for bit, and FSDP2 x 2 and
TP 2 match one process (each rank orthogonalises the whole gathered matrix).
"""

from __future__ import annotations

import dataclasses
import json
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from torch import nn

from titan_core.optim.muon import Muon, newton_schulz
from titan_core.optim.param_groups import muon_matrices

from conftest import DEBUG_LLAMA_2_LAYERS, PARITY_GLOBAL_BATCH, titan, torchrun

HYPER = {"lr": 0.02, "weight_decay": 0.1, "betas": (0.9, 0.95), "eps": 1e-8, "momentum": 0.95, "nesterov": True,
         "ns_steps": 5}


@pytest.mark.parametrize("shape", [(64, 16), (16, 64), (3, 32, 48)])
def test_newton_schulz_sets_every_singular_value_near_one(shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    matrix = torch.randn(shape) * torch.logspace(-2, 0, shape[-1])  # columns scaled over 2 decades
    out = newton_schulz(matrix, steps=5)
    assert out.shape == matrix.shape
    singular = torch.linalg.svdvals(out)
    # Muon's quintic brings every singular value into about 0.7-1.2 (not exactly 1: it is tuned for speed).
    assert singular.min() > 0.6 and singular.max() < 1.25, singular


def test_muon_takes_the_hidden_state_matrices_and_leaves_embedding_head_norms_to_adamw() -> None:
    from titan_llama.flavors import llama3_flavors
    from titan_llama.model import Transformer

    model = Transformer(dataclasses.replace(llama3_flavors["debugmodel"], n_layers=1, vocab_size=512))
    chosen = muon_matrices(model)
    muon = sorted(name for name, p in model.named_parameters() if id(p) in chosen)
    assert muon == sorted(f"layers.0.{m}.weight" for m in ("attention.wq", "attention.wk", "attention.wv",
                                                            "attention.wo", "feed_forward.w1", "feed_forward.w2",
                                                            "feed_forward.w3"))


def test_a_muon_step_is_the_scaled_orthogonalised_nesterov_momentum() -> None:
    torch.manual_seed(1)
    weight = nn.Parameter(torch.randn(8, 12))
    start = weight.detach().clone()
    opt = Muon([{"params": [weight], "use_muon": True}], **HYPER)
    grads = [torch.randn(8, 12) for _ in range(2)]
    buffer = torch.zeros(8, 12)
    expected = start.clone()
    for grad in grads:
        weight.grad = grad.clone()
        opt.step()
        buffer = 0.95 * buffer + 0.05 * grad
        nesterov = 0.95 * buffer + 0.05 * grad
        expected = expected * (1 - 0.02 * 0.1) - 0.02 * 0.2 * math.sqrt(12) * newton_schulz(nesterov, 5)
    torch.testing.assert_close(weight.detach(), expected, rtol=1e-6, atol=1e-6)


def test_the_adamw_groups_step_as_torch_adamw() -> None:
    torch.manual_seed(2)
    ours, theirs = nn.Parameter(torch.randn(5, 3)), nn.Parameter(torch.randn(5, 3))
    with torch.no_grad():
        theirs.copy_(ours)
    muon = Muon([{"params": [ours], "use_muon": False}], **HYPER)
    adamw = torch.optim.AdamW([theirs], lr=0.02, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    for _ in range(4):
        grad = torch.randn(5, 3)
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        muon.step()
        adamw.step()
    torch.testing.assert_close(ours.detach(), theirs.detach(), rtol=1e-6, atol=1e-7)


COMMON = (*DEBUG_LLAMA_2_LAYERS, "--optimizer.name=muon", "--optimizer.lr=0.01", "--training.steps=4",
          "--metrics.log_freq=1", "--lr_scheduler.warmup_steps=1", "--training.max_norm=1.0", "--training.seed=0",
          "--metrics.report=false")


def records(run_dir: Path) -> list[dict[str, float]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in (json.loads(line) for line in lines) if "loss" in r]


@pytest.mark.slow
def test_a_resumed_muon_run_repeats_the_uninterrupted_one_bit_for_bit(tmp_path: Path) -> None:
    batch = f"--training.local_batch_size={PARITY_GLOBAL_BATCH}"
    ckpt = ("--checkpoint.enable=true", "--checkpoint.interval=2")
    whole = titan(tmp_path / "whole", *COMMON, batch, *ckpt)
    assert whole.code == 0, whole.text
    first = titan(tmp_path / "split", *COMMON, batch, *ckpt, "--training.steps=2")
    assert first.code == 0, first.text
    second = titan(tmp_path / "split", *COMMON, batch, *ckpt)
    assert second.code == 0 and "resuming from" in second.text, second.text
    assert [(r["step"], r["loss"], r["grad_norm"]) for r in records(tmp_path / "split")][-2:] == \
        [(r["step"], r["loss"], r["grad_norm"]) for r in records(tmp_path / "whole")][-2:]


@pytest.mark.slow
def test_muon_under_fsdp2_and_tp2_matches_one_process(tmp_path: Path) -> None:
    half = f"--training.local_batch_size={PARITY_GLOBAL_BATCH // 2}"
    full = f"--training.local_batch_size={PARITY_GLOBAL_BATCH}"
    with ThreadPoolExecutor(max_workers=3) as pool:
        single = pool.submit(titan, tmp_path / "single", *COMMON, full)
        fsdp = pool.submit(titan, tmp_path / "fsdp", *COMMON, half, "--parallelism.dp_shard=2", nproc=2)
        tp = pool.submit(torchrun, tmp_path / "tp", *COMMON, full, "--parallelism.tp=2")
        runs = {"single": single.result(), "fsdp2": fsdp.result(), "tp2": tp.result()}
    for name, run in runs.items():
        assert run.code == 0, f"{name}: {run.text}"
    reference = records(tmp_path / "single")
    for name in ("fsdp2", "tp2"):
        got = records(runs[name].run_dir)
        for key in ("loss", "grad_norm"):
            worst = max(abs(r[key] - ref[key]) / abs(ref[key]) for r, ref in zip(got, reference))
            print(f"{name} {key}: max relative difference {worst:.2e} over {len(got)} steps")
            assert len(got) == 4 and worst <= 1e-6, (name, key, worst)


@pytest.mark.parametrize(("flag", "said"), [
    ("--optimizer.name=lion", "optimizer.name"),
    ("--optimizer.muon_ns_steps=0", "optimizer.muon_ns_steps"),
    ("--optimizer.muon_momentum=1.5", "optimizer.muon_momentum"),
    ("--optimizer.muon_nesterov=perhaps", "optimizer.muon_nesterov"),
])
def test_bad_muon_settings_are_refused_naming_the_key_and_nothing_is_written(flag: str, said: str, tmp_path: Path,
                                                                           cli) -> None:
    from conftest import assert_user_error

    run = tmp_path / "run"
    result = cli(*DEBUG_LLAMA_2_LAYERS, "--training.steps=1", f"--job.run_dir={run}", flag)
    assert_user_error(result, said)
    assert not run.exists()

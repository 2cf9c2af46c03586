"""QK-clip on multi-head latent attention (deepseek_v3): a head's factor gamma goes sqrt(gamma) to the query's and
the key's position-free rows (``wq_b``, ``wkv_b``), gamma to the query's rotary rows, and the rotary key, which
every head shares (``wkv_a``), is left alone (Kimi K2's MuonClip for MLA).

In one process: after the clip, a fresh measurement of the weights gives each head min(its maximum, tau),
the heads under tau and the rotary key unchanged. Through the CLI: a run built to blow up stays at tau, and
FSDP2 x 2 (rows in shards) and TP 2 (heads split over the ranks) give one process's figures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from titan_core.models.attention_logits import AttentionLogits, attention_logits
from titan_core.train.qk_clip import QKClip
from titan_deepseek.model import DeepSeekV3Args, Transformer

from conftest import run_main, titan

TAU = 2.0
ARGS = DeepSeekV3Args(dim=48, n_layers=2, n_heads=4, vocab_size=97, intermediate_size=80, max_seq_len=64,
                      q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
                      rope_type="yarn", rope_factor=4.0, rope_original_max_seq_len=16, rope_mscale=1.0,
                      rope_mscale_all_dim=0.8)


def _maxima(model: Transformer, tokens: torch.Tensor, adjust: Any = None) -> AttentionLogits:
    with torch.no_grad(), attention_logits(adjust) as request:
        model(tokens)
    return request


def test_the_clip_cuts_each_head_to_tau_and_leaves_the_shared_rotary_key() -> None:
    model = Transformer(ARGS)
    model.init_weights(seed=0)
    attention = model.layers["0"].attention
    with torch.no_grad():  # heads 0 and 1 of layer 0 large (their query and key/value rows): far above tau
        for name in ("wq_b", "wkv_b"):
            getattr(attention, name).weight[:32].normal_(0.0, 0.6, generator=torch.Generator().manual_seed(1))
    untouched = {name: getattr(attention, name).weight[32:].clone() for name in ("wq_b", "wkv_b")}
    tokens = torch.randint(0, 97, (2, 24), generator=torch.Generator().manual_seed(0))
    before = {id(h.module): h.max.clone() for h in _maxima(model, tokens).heads.values()}
    rotary_key = {n: m.attention.wkv_a.weight.clone() for n, m in model.layers.items()}
    assert max(float(m.max()) for m in before.values()) > 3 * TAU

    clip = QKClip(TAU, model_parts=[model], layer_of=lambda m: None, dp_group=None)
    clip.after_step(lambda adjust: _maxima(model, tokens, adjust))
    after = _maxima(model, tokens).heads.values()
    layer0 = id(model.layers["0"].attention)
    for h in after:
        if id(h.module) == layer0:  # its input is the same before and after: each head is min(max, tau) exactly
            expected = before[layer0].clamp(max=TAU)
            assert torch.allclose(h.max, expected, rtol=1e-5), (h.max, expected)
        assert float(h.max.max()) <= TAU * (1 + 1e-5)
    assert clip.clipped_heads >= 2 and bool((before[layer0][:2] > 3 * TAU).all())
    assert bool((before[layer0][2:] < TAU).all())  # heads 2 and 3 are under tau: their rows stay as they were
    for name, rows in untouched.items():
        assert torch.equal(getattr(attention, name).weight[32:], rows)
    for name, block in model.layers.items():
        assert torch.equal(block.attention.wkv_a.weight, rotary_key[name])


RUN_TAU = 0.5  # at an ordinary learning rate this cuts heads of layer 0 at every step
RUN = ("--spec", "deepseek_v3", "--flavor", "debugmoe", "--training.steps=4", "--training.seq_len=64",
       "--metrics.log_freq=1", "--metrics.report=false", "--lr_scheduler.warmup_steps=1", "--optimizer.lr=0.01",
       f"--stability.qk_clip_threshold={RUN_TAU}")


def _records(run_dir: Path) -> list[dict[str, Any]]:
    return [r for r in (json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines())
            if "loss" in r]


def test_fsdp2_x2_and_tp2_clip_as_one_process(tmp_path: Path) -> None:
    one = titan(tmp_path / "one", *RUN, "--training.local_batch_size=4")
    assert one.code == 0, one.text
    a = _records(tmp_path / "one")
    assert all(r["qk_clip/0/clipped_heads"] > 0 for r in a)
    assert all(r[f"qk_clip/{n}/max_logit"] <= RUN_TAU for r in a for n in range(4))
    for name, layout in {"fsdp2": ("--training.local_batch_size=2",),
                         "tp2": ("--training.local_batch_size=4", "--parallelism.tp=2")}.items():
        two = titan(tmp_path / name, *RUN, *layout, nproc=2)
        assert two.code == 0, two.text
        b = _records(tmp_path / name)
        for key in ("loss", "grad_norm", *(k for k in a[0] if k.startswith("qk_clip/") and "clipped" not in k)):
            worst = max(abs(x[key] - y[key]) / abs(x[key]) for x, y in zip(a, b))
            assert worst <= (1e-6 if key in ("loss", "grad_norm") else 1e-4), (name, key, worst)
        for n in range(4):
            assert [r[f"qk_clip/{n}/clipped_heads"] for r in a] == [r[f"qk_clip/{n}/clipped_heads"] for r in b]


def test_the_measuring_forward_leaves_moe_loads_and_aux_loss_alone(tmp_path: Path, capsys) -> None:
    """QK-clip's extra forward routes tokens too. With a tau no head reaches, a MoE run (with the auxiliary loss)
    must train exactly as without QK-clip: the forward's loads are not counted into the step's bias update,
    and its auxiliary loss is not added to the next micro-batch's loss (before the fix: loads off from step 1,
    losses from step 2)."""
    common = ("--spec", "deepseek_v3", "--flavor", "debugmoe", "--training.steps=3", "--metrics.log_freq=1",
              "--training.seq_len=64", "--deepseek_v3.moe_aux_loss_coeff=0.01", "--deepseek_v3.mtp_layers=1")
    runs = {}
    for name, extra in {"off": (), "never_cuts": ("--stability.qk_clip_threshold=1e9",)}.items():
        result = run_main(capsys, *common, *extra, f"--job.run_dir={tmp_path / name}")
        assert result.code == 0, result.text
        runs[name] = _records(tmp_path / name)
    keys = ("loss", "grad_norm", "moe_load_imbalance", "moe_aux_loss", "mtp_loss")
    assert [[r[k] for k in keys] for r in runs["off"]] == [[r[k] for k in keys] for r in runs["never_cuts"]]
    assert all(r["qk_clip/4/clipped_heads"] == 0 for r in runs["never_cuts"])  # the prediction block is measured

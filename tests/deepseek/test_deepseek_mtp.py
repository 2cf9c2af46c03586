"""DeepSeek-V3's multi-token prediction (``--deepseek_v3.mtp_layers=1``): the block's wiring and loss against
a computation written out here, the main logits untouched by it, the term in training (a weight of 0 trains
exactly as without the block; FSDP2 2 and EP 2 give the one-process figures), the refused layouts, and the
Hugging Face layout both ways (layer ``n_layers`` with the embedding and head copies, read back bit for bit;
transformers loads the export and computes the same logits)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hf_deepseek import FULL, VOCAB, reference, tiny_hf_deepseek
from hf_export_helpers import perturbed_model_shaped_like, save_as_hf_folder

from titan_core import IGNORE_INDEX
from titan_core.hf.folder import open_hf_folder
from titan_core.weights.load import load_hf_weights
from titan_deepseek.hf_adapter import DeepSeekV3StateDictAdapter
from titan_deepseek.model import DeepSeekV3Args, MultiTokenPrediction, Transformer, TransformerBlock, parameter_counts
from titan_deepseek.spec import deepseek_v3_spec

from conftest import assert_user_error, run_main, titan

ADAPTER = DeepSeekV3StateDictAdapter()
ARGS = DeepSeekV3Args(dim=48, n_layers=2, n_heads=4, vocab_size=97, intermediate_size=80, max_seq_len=64,
                      q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
                      n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=24, n_shared_experts=1,
                      first_k_dense_replace=1, n_group=2, topk_group=1, routed_scaling_factor=2.0,
                      mtp_layers=1, mtp_loss_weight=0.25)


def _models() -> tuple[Transformer, Transformer]:
    """(with the prediction block, without it), both from seed 0: weights drawn by name, so the main ones agree."""
    with_mtp, plain = Transformer(ARGS), Transformer(dataclasses.replace(ARGS, mtp_layers=0))
    with_mtp.init_weights(seed=0)
    plain.init_weights(seed=0)
    return with_mtp, plain


def _batch(length: int = 20) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, ARGS.vocab_size or 0, (2, length + 1), generator=torch.Generator().manual_seed(5))
    return tokens[:, :-1].clone(), tokens[:, 1:].clone()


def test_the_block_predicts_the_token_after_next_and_leaves_the_main_logits_alone() -> None:
    model, plain = _models()
    block = model.layers["2"]
    assert isinstance(block, MultiTokenPrediction) and block.moe is not None  # layer 2 >= first_k_dense_replace
    shared = {k: v for k, v in plain.state_dict().items()}
    assert all(torch.equal(model.state_dict()[k], v) for k, v in shared.items())
    extra = sorted(set(model.state_dict()) - set(shared))
    assert {"layers.2.enorm.weight", "layers.2.hnorm.weight", "layers.2.eh_proj.weight",
            "layers.2.shared_head.norm.weight", "layers.2.attention.wkv_a.weight"} <= set(extra)
    total, _ = parameter_counts(ARGS)
    assert total == sum(p.numel() for p in model.parameters())

    inputs, labels = _batch()
    labels_before = labels.clone()
    labels[0, 7] = IGNORE_INDEX  # position 6's prediction target: left out of the mean
    with torch.no_grad():
        logits = model(inputs, labels=labels)
        term, reported = block.take()
        assert torch.equal(logits, plain(inputs))
        assert block.take() is None and (model(inputs), block.take())[1] is None  # no labels: no term

        # Written out: the main stack's last hidden state (before the final norm) at i, the embedding of token
        # i + 1, the block, its norm, the main head; the cross-entropy against labels[:, i + 1].
        embedded = model.tok_embeddings(inputs)
        h = embedded
        for i in range(ARGS.n_layers):
            h = model.layers[str(i)](h, model.rope)
        next_embedded = model.tok_embeddings(torch.cat([inputs[:, 1:], labels_before[:, -1:]], dim=1))[:, :-1]
        joined = block.eh_proj(torch.cat([block.enorm(next_embedded), block.hnorm(h[:, :-1])], dim=-1))
        mtp_logits = model.output(block.shared_head.norm(TransformerBlock.forward(block, joined, model.rope)))
        log_probs = F.log_softmax(mtp_logits.double(), dim=-1)
        picked = [-log_probs[b, i, labels[b, i + 1]] for b in range(2) for i in range(19) if labels[b, i + 1] >= 0]
    assert len(picked) == 2 * 19 - 1
    expected = torch.stack(picked).mean().item()
    assert abs(reported.item() - expected) <= 1e-5 * expected
    assert abs(term.item() - 0.25 * reported.item()) <= 1e-7
    assert 0.5 * math.log(97) < reported.item() < 2 * math.log(97)


def test_position_i_sees_tokens_up_to_i_plus_1_only() -> None:
    model, _ = _models()
    block = model.layers["2"]
    inputs, _ = _batch()
    changed = inputs.clone()
    changed[:, 12] = (changed[:, 12] + 1) % 97
    outputs = []
    with torch.no_grad():
        for tokens in (inputs, changed):
            h = model.tok_embeddings(tokens)
            for i in range(ARGS.n_layers):
                h = model.layers[str(i)](h, model.rope)
            next_tokens = torch.cat([tokens[:, 1:], tokens[:, :1]], dim=1)  # the last one's stand-in: any token
            outputs.append(block(h, model.tok_embeddings(next_tokens), model.rope))
    differs = (outputs[0] - outputs[1]).abs().amax(dim=(0, 2))
    # positions 0..10 read tokens 0..11 (the experts' grouped matmul, regrouped, may differ in the last bit)
    assert differs[:11].max().item() <= 1e-6
    assert differs[11].item() > 1e-3  # position 11 reads the embedding of token 12


RUN = ("--spec", "deepseek_v3", "--flavor", "debugmoe", "--training.steps=3", "--training.seq_len=64",
       "--metrics.log_freq=1", "--lr_scheduler.warmup_steps=1", "--deepseek_v3.moe_bias_update_rate=0.01")


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]


def _close(a: float, b: float, rel: float = 1e-6) -> bool:
    return abs(a - b) <= rel * abs(a)


def test_the_term_trains_and_weight_zero_trains_as_without_the_block(tmp_path: Path, capsys) -> None:
    runs = {"plain": (), "zero": ("--deepseek_v3.mtp_layers=1", "--deepseek_v3.mtp_loss_weight=0"),
            "mtp": ("--deepseek_v3.mtp_layers=1", "--deepseek_v3.mtp_loss_weight=0.3")}
    # Without the auxiliary loss: the block's own MoE layer balances its load by it whatever the weight, and
    # that gradient reaches the main model through the block's inputs.
    no_aux = "--deepseek_v3.moe_aux_loss_coeff=0"
    records = {}
    for name, extra in runs.items():
        result = run_main(capsys, *RUN, *extra, no_aux, "--training.local_batch_size=4",
                          f"--job.run_dir={tmp_path / name}")
        assert result.code == 0, result.text
        records[name] = _records(tmp_path / name)
    plain, zero, mtp = records["plain"], records["zero"], records["mtp"]
    assert [r["step"] for r in mtp] == [1, 2, 3]
    for a, b in zip(plain, zero):  # the block's gradients are 0: the main model trains exactly as without it
        assert _close(a["loss"], b["loss"]) and _close(a["grad_norm"], b["grad_norm"])
        assert "mtp_loss" not in a and math.isfinite(b["mtp_loss"])
    assert _close(plain[0]["loss"], mtp[0]["loss"])  # the same first forward
    assert not _close(plain[0]["grad_norm"], mtp[0]["grad_norm"], 1e-3)  # the term's gradients reach the model
    assert abs(mtp[-1]["loss"] - plain[-1]["loss"]) > 1e-4
    assert all(0.5 * math.log(2048) < r["mtp_loss"] < 1.5 * math.log(2048) for r in mtp)


def test_fsdp2_and_ep2_match_one_process(tmp_path: Path, capsys) -> None:
    on = ("--deepseek_v3.mtp_layers=1",)
    one = run_main(capsys, *RUN, *on, "--training.local_batch_size=4", f"--job.run_dir={tmp_path / 'one'}")
    assert one.code == 0, one.text
    a = _records(tmp_path / "one")
    for name, layout in (("fsdp2", ()), ("ep2", ("--parallelism.ep=2",))):
        run = titan(tmp_path / name, *RUN, *on, *layout, "--training.local_batch_size=2", nproc=2)
        assert run.code == 0, run.text
        b = _records(tmp_path / name)
        assert [r["step"] for r in b] == [1, 2, 3]
        for x, y in zip(a, b):
            for key in ("loss", "grad_norm", "mtp_loss"):
                assert _close(x[key], y[key]), (name, key, x[key], y[key])
            assert x["moe_load_imbalance"] == y["moe_load_imbalance"]


# (The spec has no context parallelism yet: cp > 1 is refused before this rule.)
@pytest.mark.parametrize("layout, named", [(("--parallelism.tp=2",), "parallelism.tp=2"),
                                           (("--parallelism.pp=2",), "parallelism.pp=2")])
def test_split_layouts_are_refused(tmp_path: Path, layout: tuple[str, ...], named: str) -> None:
    run = titan(tmp_path / "run", *RUN, "--deepseek_v3.mtp_layers=1", *layout, "--dry-run", nproc=2)
    assert_user_error(run, f"deepseek_v3.mtp_layers=1 with {named}", "--deepseek_v3.mtp_layers=0")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_hf_layout_both_ways(tmp_path: Path) -> None:
    base, _ = perturbed_model_shaped_like(ADAPTER, Transformer, tiny_hf_deepseek(tmp_path / "shape", **FULL))
    args = dataclasses.replace(base, mtp_layers=1)
    model = Transformer(args)
    model.init_weights(seed=3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    tensors = save_as_hf_folder(ADAPTER, model, args, tmp_path / "export")
    n = args.n_layers
    for name in ("enorm", "hnorm", "eh_proj", "shared_head.norm", "self_attn.kv_a_proj_with_mqa",
                 "mlp.gate", "input_layernorm"):
        assert f"model.layers.{n}.{name}.weight" in tensors, name
    assert torch.equal(tensors[f"model.layers.{n}.embed_tokens.weight"], tensors["model.embed_tokens.weight"])
    assert torch.equal(tensors[f"model.layers.{n}.shared_head.head.weight"], tensors["lm_head.weight"])
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert config["num_nextn_predict_layers"] == 1 and config["num_hidden_layers"] == n

    folder = open_hf_folder(tmp_path / "export", what="test")
    read = ADAPTER.model_args_from_hf(folder.config)
    assert read.mtp_layers == 0  # config.json cannot tell whether the folder holds the layer: the run asks
    for mtp_layers in (1, 0):
        back = Transformer(dataclasses.replace(read, mtp_layers=mtp_layers))
        load_hf_weights(folder, spec=deepseek_v3_spec, model_parts=[back],
                        model_args=dataclasses.replace(read, mtp_layers=mtp_layers), ties=[])
        theirs = back.state_dict()
        assert sorted(theirs) == sorted(k for k in model.state_dict() if mtp_layers or not k.startswith(f"layers.{n}."))
        assert all(torch.equal(theirs[k], model.state_dict()[k]) for k in theirs)

    tokens = torch.randint(0, VOCAB, (2, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():  # transformers builds no prediction layer and reads the rest
        ours, hf = model.eval()(tokens), reference(tmp_path / "export")(tokens).logits
    assert (ours - hf).abs().max().item() <= 1e-5


def test_the_published_671b_with_its_prediction_layer_builds_on_meta() -> None:
    from titan_deepseek.flavors import deepseek_v3_flavors

    args = dataclasses.replace(deepseek_v3_flavors["671B"], mtp_layers=1)
    with torch.device("meta"):
        model = Transformer(args)
    total = sum(p.numel() for p in model.parameters())
    assert total == parameter_counts(args)[0]
    main = parameter_counts(deepseek_v3_flavors["671B"])[0]
    assert round(main / 1e9) == 671
    # DeepSeek's README: "671B of the Main Model weights and 14B of the MTP Module weights"; its checkpoint holds
    # the layer with its own copies of the embedding and the head (13.46B with them, 11.61B without).
    assert 13e9 < total - main + 2 * args.vocab_size * args.dim < 14.5e9

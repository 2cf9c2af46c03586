"""The qwen3 adapter against transformers' Qwen3ForCausalLM and Qwen3MoeForCausalLM.

Logits both ways, at most 1e-5 absolute in fp32, on shapes covering grouped-query attention,
tied and untied heads, norm_topk_prob both ways and a dense layer among sparse ones; the
per-expert tensors of a transformers-saved folder go through the core's stacking
(titan_core.hf.stacks) exactly as initial_load reads them. Then titan-convert round-trips a
transformers-saved tiny Qwen3-MoE bit for bit, and a folder of another MoE architecture is
one message, exit 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hf_export_helpers import assert_convert_round_trips, perturbed_model_shaped_like, save_as_hf_folder
from test_convert import convert

from titan_core.hf.folder import open_hf_folder
from titan_core.weights.load import load_hf_weights
from titan_qwen3.hf_adapter import Qwen3StateDictAdapter
from titan_qwen3.model import Qwen3Args, Transformer
from titan_qwen3.spec import qwen3_spec

from conftest import assert_user_error

ADAPTER = Qwen3StateDictAdapter()
VOCAB = 301
CASES = [
    pytest.param(dict(moe=False, tied=True, n_kv_heads=2), id="dense-gqa-tied"),
    pytest.param(dict(moe=False, tied=False, n_kv_heads=4), id="dense-mha-untied"),
    pytest.param(dict(moe=True, tied=False, n_kv_heads=2, norm_topk_prob=True, mlp_only_layers=[1]),
                 id="moe-gqa-normtopk-denselayer"),
    pytest.param(dict(moe=True, tied=True, n_kv_heads=1, norm_topk_prob=False, decoder_sparse_step=2),
                 id="moe-mqa-tied-rawtopk-sparsestep2"),
]


def tiny_hf_qwen3(folder: Path, *, moe: bool, tied: bool, n_kv_heads: int, seed: int = 0, vocab: int = VOCAB,
                  **moe_kw: Any) -> Path:
    """A random (transformers-initialised, then perturbed) Qwen3 / Qwen3-MoE saved with save_pretrained."""
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    common: dict[str, Any] = dict(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_attention_heads=4,
                                  num_key_value_heads=n_kv_heads, head_dim=24, max_position_embeddings=128,
                                  tie_word_embeddings=tied, rms_norm_eps=1e-6, rope_theta=10000.0)
    torch.manual_seed(seed)
    if moe:
        config = Qwen3MoeConfig(num_hidden_layers=3, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=40,
                                **common, **moe_kw)
        model = Qwen3MoeForCausalLM(config)
    else:
        model = Qwen3ForCausalLM(Qwen3Config(num_hidden_layers=2, **common))
    with torch.no_grad():  # norms away from 1 and a router that is not near-uniform: wrong maps show
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.float().eval().save_pretrained(folder)
    return folder


def _tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(1))


def _reference(folder: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.mark.parametrize("case", CASES)
def test_hf_to_titan_logits_match(tmp_path: Path, case: dict) -> None:
    folder = open_hf_folder(tiny_hf_qwen3(tmp_path / "hf", **case), what="test")
    if case["moe"]:  # the file holds one tensor per expert, as published checkpoints do
        assert any(k.endswith("mlp.experts.5.down_proj.weight") for k in folder.tensors)
    args = ADAPTER.model_args_from_hf(folder.config)
    assert args.n_kv_heads == case["n_kv_heads"] and args.tie_embeddings == case["tied"]
    model = Transformer(args)
    model.init_weights(seed=0)
    stats = load_hf_weights(folder, spec=qwen3_spec, model_parts=[model], model_args=args,
                            ties=[("tok_embeddings.weight", "output.weight")] if case["tied"] else [])
    assert stats.tensors == len(folder.tensors) - (6 * 3 - 3) * sum(
        layer.moe is not None for layer in model.layers.values())  # 18 expert files per layer read as 3 stacks
    if case["moe"]:
        assert [layer.moe is not None for layer in model.layers.values()] == \
            ([True, False, True] if case.get("mlp_only_layers") else [False, True, False])
    with torch.no_grad():
        ours, theirs = model.eval()(_tokens()), _reference(folder.path)(_tokens()).logits
    assert (ours - theirs).abs().max().item() <= 1e-5


@pytest.mark.parametrize("case", CASES)
def test_titan_to_hf_logits_match(tmp_path: Path, case: dict) -> None:
    base, model = perturbed_model_shaped_like(ADAPTER, Transformer, tiny_hf_qwen3(tmp_path / "shape", **case))
    out = tmp_path / "export"
    tensors = save_as_hf_folder(ADAPTER, model, base, out)
    if case["moe"]:
        assert sum(k.endswith("mlp.experts.0.gate_proj.weight") for k in tensors) == \
            sum(layer.moe is not None for layer in model.layers.values()) > 0
        assert not any("expert_bias" in k for k in tensors)
    with torch.no_grad():
        ours, theirs = model.eval()(_tokens()), _reference(out)(_tokens()).logits
    assert (ours - theirs).abs().max().item() <= 1e-5


def test_config_round_trip_and_other_architectures() -> None:
    args = Qwen3Args(dim=64, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=16, vocab_size=99, num_experts=4,
                     num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=False, decoder_sparse_step=2,
                     mlp_only_layers=(3,))
    assert ADAPTER.model_args_from_hf(ADAPTER.hf_config(args)) == args
    from titan_core import ConfigError

    with pytest.raises(ConfigError, match='describes a "mixtral" model .MixtralForCausalLM., not a Qwen3'):
        ADAPTER.model_args_from_hf({"model_type": "mixtral", "architectures": ["MixtralForCausalLM"]})


def test_convert_round_trips_a_transformers_saved_qwen3_moe(tmp_path: Path) -> None:
    source = tiny_hf_qwen3(tmp_path / "hf", moe=True, tied=False, n_kv_heads=2, norm_topk_prob=True,
                           mlp_only_layers=[1])
    # titan-convert's main in this process (the console script itself is run by tests/hf/test_convert.py)
    assert_convert_round_trips(source, "qwen3", tmp_path, _reference, _tokens())


def test_a_folder_of_another_moe_architecture_is_one_message(tmp_path: Path) -> None:
    from transformers import MixtralConfig, MixtralForCausalLM

    MixtralForCausalLM(MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1, num_local_experts=2,
                                     num_experts_per_tok=1)).save_pretrained(tmp_path / "mixtral")
    result = convert("from-hf", "--spec", "qwen3", str(tmp_path / "mixtral"), str(tmp_path / "out"))
    assert_user_error(result, 'config.json describes a "mixtral" model (MixtralForCausalLM), not a Qwen3')
    assert not (tmp_path / "out").exists()

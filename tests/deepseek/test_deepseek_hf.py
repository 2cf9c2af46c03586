"""The deepseek_v3 adapter against transformers' DeepseekV3ForCausalLM.

Both ways on two shapes that between them flip every switch (hf_deepseek.FULL / PLAIN): the
loaded model's logits within 1e-5 absolute and its step-1 loss (the training cross-entropy
before any update) within 1e-5 relative; an exported model (with a non-zero routing bias, which
transformers adds to the sigmoid scores) read by transformers gives the same logits. Then
titan-convert round-trips a transformers-saved folder bit for bit (tensors and logits), and
config.json round-trips through the model args.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hf_deepseek import FULL, PLAIN, VOCAB, reference, tiny_hf_deepseek
from hf_export_helpers import assert_convert_round_trips, perturbed_model_shaped_like, save_as_hf_folder

from titan_core import ConfigError, cross_entropy_loss
from titan_core.hf.folder import open_hf_folder
from titan_core.weights.load import load_hf_weights
from titan_deepseek.hf_adapter import DeepSeekV3StateDictAdapter
from titan_deepseek.model import DeepSeekV3Args, Transformer
from titan_deepseek.spec import deepseek_v3_spec

ADAPTER = DeepSeekV3StateDictAdapter()
CASES = [pytest.param(FULL, id="qlora-yarn-groups-densefirst"), pytest.param(PLAIN, id="noqlora-plainrope-rawtopk")]


def _tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 25), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("case", CASES)
def test_hf_to_titan_logits_and_step1_loss_match(tmp_path: Path, case: dict) -> None:
    folder = open_hf_folder(tiny_hf_deepseek(tmp_path / "hf", **case), what="test")
    assert any(k.endswith("mlp.experts.7.down_proj.weight") for k in folder.tensors)  # one tensor per expert
    args = ADAPTER.model_args_from_hf(folder.config)
    model = Transformer(args)
    model.init_weights(seed=0)
    load_hf_weights(folder, spec=deepseek_v3_spec, model_parts=[model], model_args=args, ties=[])
    assert [layer.moe is not None for layer in model.layers.values()] == \
        [i >= case["first_k_dense_replace"] for i in range(3)]
    tokens = _tokens()
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    with torch.no_grad():
        ours, theirs = model.eval()(inputs), reference(folder.path)(inputs).logits
    assert (ours - theirs).abs().max().item() <= 1e-5
    loss, hf_loss = cross_entropy_loss(ours, labels).item(), cross_entropy_loss(theirs, labels).item()
    assert abs(loss - hf_loss) <= 1e-5 * hf_loss


@pytest.mark.parametrize("case", CASES)
def test_titan_to_hf_logits_match_with_a_routing_bias(tmp_path: Path, case: dict) -> None:
    base, model = perturbed_model_shaped_like(ADAPTER, Transformer, tiny_hf_deepseek(tmp_path / "shape", **case))
    with torch.no_grad():
        for layer in model.layers.values():
            if layer.moe is not None:  # strong enough to change which experts win
                layer.moe.router.expert_bias.copy_(torch.randn(8) * 0.3)
    out = tmp_path / "export"
    tensors = save_as_hf_folder(ADAPTER, model, base, out)
    assert sum(k.endswith("e_score_correction_bias") for k in tensors) == 3 - case["first_k_dense_replace"]
    with torch.no_grad():
        ours, theirs = model.eval()(_tokens()), reference(out)(_tokens()).logits
        for layer in model.layers.values():
            if layer.moe is not None:
                layer.moe.router.expert_bias.zero_()
        unbiased = model(_tokens())
    assert (ours - theirs).abs().max().item() <= 1e-5
    assert (ours - unbiased).abs().max().item() > 1e-3  # the bias did change the routing


def test_convert_round_trips_a_transformers_saved_deepseek_v3(tmp_path: Path) -> None:
    source = tiny_hf_deepseek(tmp_path / "hf", **FULL)
    assert_convert_round_trips(source, "deepseek_v3", tmp_path, reference, _tokens())


def test_config_round_trip_and_refusals() -> None:
    args = DeepSeekV3Args(dim=64, n_layers=4, n_heads=4, vocab_size=99, intermediate_size=96, q_lora_rank=32,
                          kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, rope_type="yarn",
                          rope_factor=8.0, rope_original_max_seq_len=256, rope_mscale=0.7, rope_mscale_all_dim=0.7,
                          n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, n_shared_experts=1,
                          first_k_dense_replace=2, n_group=2, topk_group=1, routed_scaling_factor=2.0)
    assert ADAPTER.model_args_from_hf(ADAPTER.hf_config(args)) == args
    dense = DeepSeekV3Args(dim=64, n_layers=2, n_heads=4, vocab_size=99, intermediate_size=96)
    assert ADAPTER.model_args_from_hf(ADAPTER.hf_config(dense)) == dense
    with pytest.raises(ConfigError, match='describes a "qwen3_moe" model .Qwen3MoeForCausalLM., not a DeepSeek-V3'):
        ADAPTER.model_args_from_hf({"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"]})
    bad = {**ADAPTER.hf_config(args), "qk_rope_head_dim": 5, "rope_parameters": {"rope_type": "longrope"},
           "rope_scaling": None}
    with pytest.raises(ConfigError) as caught:
        ADAPTER.model_args_from_hf(bad)
    assert "qk_rope_head_dim=5 (an even number" in str(caught.value) and "'longrope' RoPE scaling" in str(caught.value)

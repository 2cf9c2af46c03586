"""DeepSeek-V3's model and the core's MoE routing it uses, in-process on tiny shapes.

The published flavors build on meta with the published parameter totals; group-limited sigmoid
routing against a direct reading of DeepSeek-V3's rule; the routing bias changing only the
choice; dense-first layers; one training step of debugmoe that moves the routing bias.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch

from titan_core.moe import MoE, MoEMonitor, TopKRouter, is_moe_layer
from titan_deepseek.flavors import deepseek_v3_flavors
from titan_deepseek.model import Transformer, parameter_counts


@pytest.mark.parametrize(("flavor", "total", "active"), [("671B", 671.0e9, 37.6e9), ("Moonlight-16B-A3B", 15.96e9, 2.91e9)])
def test_published_flavors_build_on_meta_with_their_published_sizes(flavor: str, total: float, active: float) -> None:
    args = deepseek_v3_flavors[flavor]
    counted_total, counted_active = parameter_counts(args)
    assert abs(counted_total - total) <= 0.005 * total and abs(counted_active - active) <= 0.01 * active
    if flavor == "Moonlight-16B-A3B":  # the 671B one takes seconds just to create its modules
        with torch.device("meta"):
            model = Transformer(args)
        assert sum(p.numel() for p in model.parameters()) == counted_total
        assert model.layers["0"].moe is None and model.layers["1"].moe is not None
        assert model.layers["1"].attention.wq is not None and model.layers["1"].attention.wq_a is None


def _direct_routing(scores: torch.Tensor, bias: torch.Tensor, n_group: int, topk_group: int, top_k: int) -> list[set[int]]:
    """DeepSeek-V3's rule read literally, token by token: rank groups by the sum of their two best biased
    scores, keep the best topk_group groups, take the top_k biased scores among their experts."""
    chosen = []
    per_group = scores.shape[1] // n_group
    for row in (scores + bias).detach():
        groups = sorted(range(n_group), key=lambda g: -float(row[g * per_group:(g + 1) * per_group].topk(2).values.sum()))
        allowed = [e for g in groups[:topk_group] for e in range(g * per_group, (g + 1) * per_group)]
        chosen.append(set(sorted(allowed, key=lambda e: -float(row[e]))[:top_k]))
    return chosen


def test_group_limited_sigmoid_routing_follows_deepseek_v3s_rule() -> None:
    torch.manual_seed(0)
    router = TopKRouter(16, 12, 3, norm_topk_prob=True, score_func="sigmoid", n_group=4, topk_group=2,
                        routed_scaling_factor=2.5)
    router.expert_bias.copy_(torch.randn(12) * 0.2)
    x = torch.randn(40, 16)
    weights, experts, probs = router(x)
    scores = torch.sigmoid(router.gate(x))
    assert [set(row.tolist()) for row in experts] == _direct_routing(scores, router.expert_bias, 4, 2, 3)
    # Each token's experts come from at most 2 of the 4 groups.
    assert max(len({int(e) // 3 for e in row}) for row in experts) <= 2
    # Weights: the unbiased scores of the chosen experts, renormalised, times the scaling factor.
    expected = scores.gather(1, experts)
    torch.testing.assert_close(weights, 2.5 * expected / expected.sum(-1, keepdim=True), rtol=0, atol=1e-6)
    torch.testing.assert_close(probs.sum(-1), torch.ones(40))  # the aux loss's normalised scores
    with pytest.raises(ValueError, match="top_k=7 is more than the 6 experts of the topk_group=2 groups"):
        TopKRouter(16, 12, 7, norm_topk_prob=True, score_func="sigmoid", n_group=4, topk_group=2)
    with pytest.raises(ValueError, match="n_group=5 must be 1 or more and divide num_experts=12"):
        TopKRouter(16, 12, 2, norm_topk_prob=True, n_group=5)


def test_softmax_routing_is_unchanged_by_the_new_settings() -> None:
    """Qwen3-MoE's path: softmax probabilities of the top-k logits, renormalised; one group, no scaling."""
    torch.manual_seed(1)
    router = TopKRouter(16, 8, 2, norm_topk_prob=True)
    x = torch.randn(30, 16)
    weights, experts, probs = router(x)
    reference = torch.softmax(router.gate(x), dim=-1)
    top, ids = reference.topk(2, dim=-1)
    assert torch.equal(experts, ids) and torch.equal(weights, top / top.sum(-1, keepdim=True))
    assert torch.equal(probs, reference)


def test_dense_first_layers_and_the_other_layer_rules() -> None:
    assert [is_moe_layer(i, num_experts=4, first_k_dense=2) for i in range(4)] == [False, False, True, True]
    assert [is_moe_layer(i, num_experts=4, sparse_step=2, dense_layers=(3,)) for i in range(4)] == \
        [False, True, False, False]
    assert not any(is_moe_layer(i, num_experts=0) for i in range(3))
    with pytest.raises(ValueError, match="first_k_dense_replace=4 leaves none of the 4 layers with experts"):
        replace(deepseek_v3_flavors["debugmoe"], first_k_dense_replace=4)


def test_debugmoe_trains_a_step_and_moves_the_routing_bias() -> None:
    args = replace(deepseek_v3_flavors["debugmoe"], vocab_size=128, n_layers=2, moe_aux_loss_coeff=0.01)
    model = Transformer(args)
    model.init_weights(seed=0)
    tokens = torch.randint(0, 128, (2, 33), generator=torch.Generator().manual_seed(0))
    monitor = MoEMonitor([model])
    loss = torch.nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
    aux = monitor.after_forward()
    assert aux is not None and aux.item() > 0  # the sequence-wise loss of the one MoE layer
    (loss + aux).backward()
    router = model.layers["1"].moe.router
    assert router.gate.weight.grad is not None and router.gate.weight.grad.abs().sum() > 0
    figures = monitor.after_step()
    assert figures["moe_load_imbalance"] >= 1.0 and router.expert_bias.abs().sum() > 0
    assert abs(float(router.expert_bias.sum())) < 1e-6  # re-centred


def test_every_combination_of_the_block_switches_runs_forward_and_backward() -> None:
    base = replace(deepseek_v3_flavors["debugmoe"], vocab_size=64, n_layers=2, dim=32, n_heads=2, q_lora_rank=16,
                   kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, intermediate_size=48,
                   moe_intermediate_size=16)
    for q_lora, interleave, shared, rope_type in itertools.product((0, 16), (True, False), (0, 2), ("default", "yarn")):
        model = Transformer(replace(base, q_lora_rank=q_lora, rope_interleave=interleave, n_shared_experts=shared,
                                    rope_type=rope_type))
        model.init_weights(seed=0)
        out = model(torch.randint(0, 64, (1, 8)))
        out.sum().backward()
        assert out.shape == (1, 8, 64) and torch.isfinite(out).all()
        assert isinstance(model.layers["1"].moe, MoE) and (model.layers["1"].moe.shared_experts is None) == (shared == 0)


def test_the_latent_cache_samples_as_the_full_forward_and_holds_a_fraction_of_mha() -> None:
    """Token by token with the cache (prefix 5, then 1, then 3 at once) = one forward over the whole
    sequence; the cache holds kv_lora_rank + qk_rope_head_dim numbers per token and layer."""
    from titan_core import KVCache
    from titan_deepseek.model import cache_bytes_per_token

    args = replace(deepseek_v3_flavors["debugmoe"], vocab_size=64, n_layers=2)
    model = Transformer(args)
    model.init_weights(seed=0)
    model.eval()
    tokens = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    cache = KVCache(16)
    with torch.no_grad():
        full = model(tokens)
        parts = []
        for a, b in ((0, 5), (5, 6), (6, 9)):
            parts.append(model(tokens[:, a:b], cache=cache))
            cache.advance(b - a)
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=0, atol=1e-5)
    stored = sum(t.numel() * t.element_size() for layer in cache._layers.values() for t in (layer._k, layer._v))
    latent, mha = cache_bytes_per_token(args)
    assert stored == latent * 2 * 16  # 2 sequences x 16 positions
    assert (latent, mha) == (2 * 80 * 4, 2 * 8 * (48 + 32) * 4) and latent * 8 == mha  # 1/8 of MHA's

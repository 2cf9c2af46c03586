"""The qwen3 model and titan_core.moe: published parameter counts, the MoE block against a
per-token reference, grouped GEMM, the auxiliary loss, and the routing-bias balancing update."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from titan_core.moe import (
    MoE,
    MoEMonitor,
    grouped_linear,
    grouped_mm_available,
    load_balancing_loss,
    load_imbalance,
    update_expert_bias,
)
from titan_qwen3.flavors import qwen3_flavors
from titan_qwen3.model import Transformer, parameter_counts

# Published figures (the model cards, in billions): total, activated (MoE), non-embedding.
PUBLISHED = {
    "0.6B": ("0.6", None, "0.44"), "1.7B": ("1.7", None, "1.4"), "4B": ("4.0", None, "3.6"),
    "8B": ("8.2", None, "6.95"), "30B-A3B": ("30.5", 3.3, "29.9"), "235B-A22B": ("235", 22.0, "234"),
}


def _rounds_to(count: int, published: str) -> bool:
    """``count`` shown in billions with the card's digits is the card's figure."""
    digits = len(published.split(".")[1]) if "." in published else 0
    return f"{count / 1e9:.{digits}f}" == published


@pytest.mark.parametrize("flavor", list(PUBLISHED))
def test_published_parameter_counts(flavor: str) -> None:
    args = qwen3_flavors[flavor]
    with torch.device("meta"):
        model = Transformer(args)
    built = sum(p.numel() for p in model.parameters())  # a tied head is one tensor, counted once
    total, active = parameter_counts(args)
    assert built == total
    want_total, want_active, want_non_embedding = PUBLISHED[flavor]
    embeddings = args.vocab_size * args.dim * (1 if args.tie_embeddings else 2)
    assert _rounds_to(total, want_total) and _rounds_to(total - embeddings, want_non_embedding)
    if want_active is None:
        assert active == total  # dense
    else:
        # The cards cut rather than round activated counts (3.3B for 3.35B): within 2%.
        assert abs(active / 1e9 - want_active) <= 0.02 * want_active


def test_sparse_layer_rule_follows_hugging_face() -> None:
    args = dataclasses.replace(qwen3_flavors["debugmoe"], n_layers=6, decoder_sparse_step=2, mlp_only_layers=(3,),
                               vocab_size=64)
    assert [args.is_sparse(i) for i in range(6)] == [False, True, False, False, False, True]
    model = Transformer(args)
    assert [layer.moe is not None for layer in model.layers.values()] == [False, True, False, False, False, True]


def _reference_moe(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """Token by token, expert by expert: what the MoE block must compute."""
    flat = x.reshape(-1, x.shape[-1])
    probs = F.softmax(moe.router.gate(flat), dim=-1, dtype=torch.float32)
    out = torch.zeros_like(flat)
    e = moe.experts
    for t in range(flat.shape[0]):
        chosen = torch.topk(moe.router.gate(flat[t]) + moe.router.expert_bias, moe.router.top_k).indices
        weights = probs[t, chosen]
        if moe.router.norm_topk_prob:
            weights = weights / weights.sum()
        for w, i in zip(weights, chosen):
            h = F.silu(e.w1[i] @ flat[t]) * (e.w3[i] @ flat[t])
            out[t] += w * (e.w2[i] @ h)
    return out.reshape(x.shape)


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_moe_block_matches_a_per_token_reference(norm_topk_prob: bool) -> None:
    torch.manual_seed(0)
    moe = MoE(16, 24, num_experts=5, top_k=2, norm_topk_prob=norm_topk_prob)
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.3)
    moe.router.expert_bias.copy_(torch.tensor([0.0, 0.3, 0.0, -0.2, 0.1]))  # shifts the choice, not the weights
    x = torch.randn(2, 7, 16)
    with torch.no_grad():
        assert (moe(x) - _reference_moe(moe, x)).abs().max().item() <= 1e-5


def test_grouped_linear_fallback_equals_one_matmul_per_expert() -> None:
    torch.manual_seed(0)
    w = torch.randn(4, 6, 8)
    counts = torch.tensor([3, 0, 5, 2])
    x = torch.randn(int(counts.sum()), 8)
    expected = torch.cat([x[0:3] @ w[0].T, x[3:8] @ w[2].T, x[8:10] @ w[3].T])
    assert torch.equal(grouped_linear(x, w, counts), expected)


def test_grouped_mm_on_cpu_is_bit_identical_to_one_matmul_per_expert() -> None:
    """fp32 on CPU with 16-byte aligned widths takes torch._grouped_mm: same numbers as the loop,
    forward and backward (an empty expert included)."""
    torch.manual_seed(0)
    counts = torch.tensor([3, 0, 5, 2])
    w = torch.randn(4, 12, 8, requires_grad=True)
    x = torch.randn(int(counts.sum()), 8, requires_grad=True)
    assert grouped_mm_available(x, w) and not grouped_mm_available(x[:, :6], w)  # 6 floats: 24 bytes
    grad = torch.randn(10, 12)
    grouped_linear(x, w, counts).backward(grad)
    got = (x.grad.clone(), w.grad.clone())
    x.grad = w.grad = None
    expected = torch.cat([x[0:3] @ w[0].T, x[3:8] @ w[2].T, x[8:10] @ w[3].T])
    expected.backward(grad)
    assert torch.equal(grouped_linear(x, w, counts), expected)
    assert torch.equal(got[0], x.grad) and torch.equal(got[1], w.grad)


def test_aux_loss_is_one_when_even_and_reaches_the_router() -> None:
    even = torch.tensor([[[0, 1], [2, 3]], [[1, 3], [0, 2]]])  # 2 sequences of 2 tokens, 2 choices each
    assert load_balancing_loss(torch.full((2, 2, 4), 0.25), even).item() == pytest.approx(1.0)
    # All on expert 0 with all the probability there: E * 1/2 * 1 (half the choices are the second pick).
    skewed = torch.tensor([[[0, 1], [0, 1]]])
    probs = torch.tensor([[[1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]])
    assert load_balancing_loss(probs, skewed).item() == pytest.approx(2.0)
    torch.manual_seed(0)
    moe = MoE(16, 8, num_experts=4, top_k=2, norm_topk_prob=True, aux_loss_coeff=0.5)
    monitor = MoEMonitor([moe])
    moe(torch.randn(3, 5, 16))
    aux = monitor.after_forward()
    assert aux is not None and aux.item() > 0
    aux.backward()
    assert moe.router.gate.weight.grad is not None and moe.router.gate.weight.grad.abs().sum() > 0
    figures = monitor.after_step()
    assert figures["moe_aux_loss"] == pytest.approx(aux.item()) and figures["moe_load_imbalance"] >= 1.0



def test_aux_loss_joined_through_the_output_trains_as_if_added_to_the_loss() -> None:
    """A pipeline stage's path (aux_loss_in_backward): two micro-batches whose backward starts at the output
    give the gradients of output loss + weight x aux loss, and the figure is the mean over the micro-batches."""
    def fresh() -> tuple[MoE, list[torch.Tensor]]:
        torch.manual_seed(0)
        moe = MoE(16, 8, num_experts=4, top_k=2, norm_topk_prob=True, aux_loss_coeff=0.5)
        with torch.no_grad():
            for param in moe.parameters():  # (the experts' weights are left uninitialised by the block)
                param.normal_(0, 0.3)
        return moe, [torch.randn(3, 5, 16) for _ in range(2)]
    added, inputs = fresh()
    added_monitor = MoEMonitor([added])
    auxes = []
    for x in inputs:
        out = added(x)
        aux = added_monitor.after_forward()
        assert aux is not None
        auxes.append(aux.item())
        (out.square().mean() + 0.25 * aux).backward()
    joined, inputs = fresh()
    joined_monitor = MoEMonitor([joined], aux_loss_in_backward=0.25)
    for x in inputs:
        joined(x).square().mean().backward()
    assert joined.aux_loss is None and joined_monitor.after_forward() is None  # nothing left for the trainer
    for a, b in zip(added.parameters(), joined.parameters()):
        assert a.grad is not None and b.grad is not None and torch.allclose(a.grad, b.grad, rtol=1e-6, atol=1e-8)
    assert joined.router.gate.weight.grad.abs().sum() > 0
    assert joined_monitor.after_step()["moe_aux_loss"] == pytest.approx(sum(auxes) / 2, rel=1e-6)


def _balance_run(spread: float, rate: float, steps: int = 60) -> list[float]:
    """A router that sends most tokens to expert 0; the load imbalance of each step under the bias update.

    ``spread``: how much the tokens differ around their shared mean (small: every token ranks
    the experts alike, as the hidden states of a model early in training do)."""
    torch.manual_seed(0)
    moe = MoE(16, 8, num_experts=4, top_k=1, norm_topk_prob=False, bias_update_rate=rate)
    with torch.no_grad():
        moe.router.gate.weight.normal_(std=0.3)
        moe.router.gate.weight[0] += 0.2  # expert 0 scores higher for inputs with a positive mean
    x = torch.randn(1024, 16) * spread + 0.5
    monitor = MoEMonitor([moe])
    figures = []
    for _ in range(steps):
        with torch.no_grad():
            moe(x)
        monitor.after_forward()
        figures.append(monitor.after_step()["moe_load_imbalance"])
    assert abs(moe.router.expert_bias.sum().item()) < 1e-5  # re-centred
    return figures


def test_bias_update_moves_the_load_toward_even() -> None:
    """The DeepSeek-V3 update spreads out a router that sends most tokens to expert 0."""
    figures = _balance_run(spread=1.0, rate=0.1)
    assert figures[0] > 2.5  # badly skewed at the start (measured 2.57)
    assert all(b <= a + 0.05 for a, b in zip(figures, figures[1:]))  # falls (up to the update's own jitter)
    assert max(figures[-10:]) < 1.05  # measured: 1.02 at most over the last 10 steps, below 1.1 from step 28


def test_bias_update_evens_out_tokens_that_all_rank_the_experts_alike() -> None:
    """Nearly identical tokens all go to one expert at first. The update must split them and
    then hold still: the former rule (a fixed step of 1e-2 by the sign, on the probabilities)
    flipped them between experts and stayed at 1.79 over the last 10 steps of this run."""
    figures = _balance_run(spread=0.1, rate=0.1)
    assert figures[0] == 4.0  # every token on one of the 4 experts
    assert max(figures[-10:]) < 1.05  # measured: 1.004, below 1.1 from step 9


def test_update_expert_bias_and_imbalance_figures() -> None:
    bias = torch.zeros(4)
    update_expert_bias(bias, torch.tensor([10, 2, 2, 2]), rate=0.1)
    # 0.1 x log(mean 4 / load), then re-centred: 0.1 x (log 0.4, log 2, log 2, log 2) - 0.02908
    assert bias.tolist() == pytest.approx([-0.12071, 0.04024, 0.04024, 0.04024], abs=1e-5)
    bias = torch.zeros(2)
    update_expert_bias(bias, torch.tensor([0, 8]), rate=1.0)  # an empty expert: log(4 / 0.5) clipped to 2
    assert bias.tolist() == pytest.approx([1.34657, -1.34657], abs=1e-5)  # (2, log 0.5) re-centred
    update_expert_bias(bias, torch.tensor([0, 0]), rate=1.0)  # nothing routed: no evidence, no change
    assert bias.tolist() == pytest.approx([1.34657, -1.34657], abs=1e-5)
    assert load_imbalance(torch.tensor([10, 2, 2, 2])) == pytest.approx(2.5)
    assert load_imbalance(torch.zeros(4)) == 1.0


@pytest.mark.parametrize(("tied", "std"), [(False, 1.0), (True, 0.02)])
def test_embedding_init_scale(tied: bool, std: float) -> None:
    """Untied, the embedding starts at unit scale (at 0.02 every token's hidden state starts out
    nearly the same and a MoE router sends them all to the same experts); tied, it is also the
    head and starts as small as Hugging Face's."""
    args = dataclasses.replace(qwen3_flavors["debugmoe"], vocab_size=512, n_layers=1, tie_embeddings=tied)
    model = Transformer(args)
    model.init_weights(seed=0)
    assert model.tok_embeddings.weight.std().item() == pytest.approx(std, rel=0.05)

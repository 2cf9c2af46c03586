"""Load balancing of experts: the auxiliary loss, DeepSeek-V3's bias update, and the load figures.

* :func:`load_balancing_loss`: ``E * sum_e f_e * P_e`` with ``f_e`` the share of routing
  choices that went to expert e and ``P_e`` its mean router probability (1.0 when perfectly
  even; a gradient through ``P`` only), taken per sequence and averaged over the sequences
  (DeepSeek-V3's sequence-wise form). Per sequence, it does not depend on how the batch is
  split over data-parallel ranks: every layout trains on the same loss. Under context
  parallelism each rank holds part of every sequence: ``sequence_group`` (the cp ranks) sums
  the choice counts, so ``f`` is the whole sequence's, and each rank's figure takes ``P`` over its
  own tokens. Their mean is the whole sequence's loss, and each rank's gradient is its tokens'
  share of the whole one (the gradient averaging over cp ranks then gives exactly that).
* :func:`update_expert_bias`: the auxiliary-loss-free method (DeepSeek-V3, section 2.1.2):
  after each optimizer step every expert's routing bias (on the router logits) moves towards
  even load (up when under-loaded, down when over-loaded), then the biases are re-centred.
  The step is ``rate`` times the log of mean load over the expert's load (clipped to
  +-``MAX_LOG_RATIO``), not DeepSeek-V3's fixed ``rate`` times its sign: an expert's share
  of tokens grows roughly exponentially with its logit bias, so the log ratio is the size of
  correction that evens it out; it is large while one expert takes every token (early in
  training the router collapses within a few steps) and shrinks to nothing near even load,
  where a fixed step kept overshooting (measured: see docs/benchmarks.md).
* :func:`load_imbalance`: max / mean tokens per expert (1.0 is perfectly even).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

# The largest correction one step makes, in log load ratio (e**2: an expert with a 7x excess
# or shortfall moves as far as one with 100x): one empty or overfull step cannot throw the bias far.
MAX_LOG_RATIO = 2.0


def load_balancing_loss(probs: torch.Tensor, experts: torch.Tensor, *,
                        sequence_group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """The auxiliary loss of one layer (not yet multiplied by its coefficient).

    ``probs``: router probabilities [sequences, tokens, experts]; ``experts``: the chosen
    expert ids [sequences, tokens, k]; ``sequence_group``: the ranks holding the other tokens
    of the same sequences (context parallelism), or None.
    """
    n_seq, n_tok, num_experts = probs.shape
    top_k = experts.shape[-1]
    ones = torch.ones(experts.shape[0], n_tok * top_k, dtype=probs.dtype, device=probs.device)
    counts = torch.zeros(n_seq, num_experts, dtype=probs.dtype, device=probs.device)
    counts.scatter_add_(1, experts.reshape(n_seq, -1), ones)
    choices = n_tok * top_k
    if sequence_group is not None:  # counts carry no gradient: a plain sum over the ranks
        dist.all_reduce(counts, group=sequence_group)
        choices *= dist.get_world_size(sequence_group)
    share = counts / max(choices, 1)
    return num_experts * (share * probs.mean(1)).sum(-1).mean()


@torch.no_grad()
def update_expert_bias(bias: torch.Tensor, counts: torch.Tensor, rate: float) -> None:
    """Move ``bias`` (in place) by ``rate`` x log(mean load / load) towards even load, given the step's ``counts``."""
    load = counts.to(torch.float32)
    # An expert that got no token counts as half of one: the log stays finite (then clipped).
    ratio = torch.log(load.mean() / load.clamp(min=0.5)).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    moved = bias + rate * ratio
    moved -= moved.mean()
    # Nothing routed: no evidence either way, the bias stays (decided on the device: no host read).
    bias.copy_(torch.where(load.sum() > 0, moved, bias))


def load_imbalance(counts: torch.Tensor) -> float:
    """max / mean tokens per expert; 1.0 when even (and when nothing was routed)."""
    load = counts.to(torch.float64)
    mean = float(load.mean())
    return float(load.max()) / mean if mean > 0 else 1.0

"""What the decoder plugins share beyond ``model_parts``: the token embedding built once the vocabulary
is known, the RMSNorm computed in float32 (titan-qwen3, titan-deepseek), and the parameter and FLOP
counts of a pre-norm stack of dense and MoE layers.

A leaf like ``model_parts``: imports nothing of titan_core, so a plugin's model file imports it freely.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

__all__ = ["RMSNorm", "decoder_flops_per_token", "decoder_parameter_counts", "token_embedding"]


class DecoderShape(Protocol):
    """The two fields of a model-args dataclass that size its embedding."""

    @property
    def vocab_size(self) -> int | None: ...

    @property
    def dim(self) -> int: ...


def token_embedding(args: DecoderShape) -> nn.Embedding:
    """The ``vocab_size x dim`` token embedding of a model built from ``args``; a ValueError naming the args'
    class while ``vocab_size`` is still None (the core fills it from the tokenizer before building)."""
    if args.vocab_size is None:
        raise ValueError(f"{type(args).__name__}.vocab_size is None: fill it (from the tokenizer) before building "
                         f"the model")
    return nn.Embedding(args.vocab_size, args.dim)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension, computed in float32 (Qwen3, DeepSeek-V3)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        out: torch.Tensor = self.weight * h.type_as(x)
        return out


def decoder_parameter_counts(*, vocab_size: int, dim: int, tie_embeddings: bool, attention: int, sparse: list[bool],
                             dense_hidden: int, num_experts: int, experts_per_token: int, expert_hidden: int,
                             shared_hidden: int) -> tuple[int, int]:
    """(total, active per token) parameters of a decoder whose layer i is a MoE layer when ``sparse[i]``,
    embedding and head included (a tied head counted once). ``attention``: one block's attention weights
    and norms; each MLP is SwiGLU (3 matrices), a MoE layer's router ``dim x num_experts`` plus its experts
    (``experts_per_token`` of them active) and its shared experts (``shared_hidden`` wide, 0: none)."""
    expert = 3 * dim * expert_hidden
    shared = 3 * dim * shared_hidden
    total = active = vocab_size * dim * (1 if tie_embeddings else 2) + dim
    for is_sparse in sparse:
        total += attention
        active += attention
        if is_sparse:
            router = dim * num_experts
            total += router + num_experts * expert + shared
            active += router + experts_per_token * expert + shared
        else:
            total += 3 * dim * dense_hidden
            active += 3 * dim * dense_hidden
    return total, active


def decoder_flops_per_token(active: int, *, vocab_size: int, dim: int, tie_embeddings: bool, seq_len: int,
                            full_attention: bool, attention_per_key: float) -> float:
    """Training FLOPs per token: 6 x the ``active`` parameters less the embedding (the head's matmul counted,
    tied or not), plus ``attention_per_key`` (all layers' score and value matmuls per key) times the keys a
    query attends to: (seq_len + 1) / 2 on average under the causal mask, or seq_len (``full_attention``)."""
    non_embedding = active - vocab_size * dim * (0 if tie_embeddings else 1)
    keys_per_query = seq_len if full_attention else (seq_len + 1) / 2
    return 6.0 * non_embedding + attention_per_key * keys_per_query

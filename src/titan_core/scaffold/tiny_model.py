"""The tiny model: a pre-norm causal decoder (RMSNorm, multi-head attention, SwiGLU MLP).

No parallelism and no config plumbing here: the model is built on the meta device,
then titan-core applies TP (from tp_plan.py), activation checkpointing, compile and
FSDP2, materializes it, and fills each parameter through ``init_parameter``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class TinyArgs:
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    hidden: int = 256
    vocab_size: int | None = None  # None: titan-core fills it from the tokenizer


class Attention(nn.Module):
    def __init__(self, a: TinyArgs) -> None:
        super().__init__()
        self.head_dim = a.dim // a.n_heads
        self.wq = nn.Linear(a.dim, a.dim, bias=False)
        self.wk = nn.Linear(a.dim, a.dim, bias=False)
        self.wv = nn.Linear(a.dim, a.dim, bias=False)
        self.wo = nn.Linear(a.dim, a.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # "-1" heads: under TP each rank holds only its own heads.
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y: torch.Tensor = self.wo(out.transpose(1, 2).reshape(b, s, -1))
        return y


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1(x)) * w3(x))."""

    def __init__(self, a: TinyArgs) -> None:
        super().__init__()
        self.w1 = nn.Linear(a.dim, a.hidden, bias=False)
        self.w2 = nn.Linear(a.hidden, a.dim, bias=False)
        self.w3 = nn.Linear(a.dim, a.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.w2(F.silu(self.w1(x)) * self.w3(x))
        return y


class Block(nn.Module):
    def __init__(self, a: TinyArgs) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(a.dim)
        self.attention = Attention(a)
        self.ffn_norm = nn.RMSNorm(a.dim)
        self.feed_forward = FeedForward(a)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h: torch.Tensor = x + self.attention(self.attention_norm(x))
        y: torch.Tensor = h + self.feed_forward(self.ffn_norm(h))
        return y


class TinyModel(nn.Module):
    """Token ids [batch, seq] -> logits [batch, seq, vocab]."""

    # init_parameter below draws each value by the parameter's name alone, never by the tensor's shape:
    # titan-core may then fill a large parameter tile by tile, each rank only its own shard's tiles.
    # Set it False if your init reads the shape (a fan-in std, an identity matrix).
    init_is_elementwise = True

    def __init__(self, a: TinyArgs) -> None:
        super().__init__()
        if a.vocab_size is None:
            raise ValueError("TinyArgs.vocab_size is None: set it (titan-core fills it from the tokenizer)")
        self.args = a
        self.tok_embeddings = nn.Embedding(a.vocab_size, a.dim)
        # A ModuleDict keyed "0".."n-1": titan-core's default parallelize_fn treats
        # model.layers as the blocks (checkpointed, compiled and sharded one by one).
        self.layers = nn.ModuleDict({str(i): Block(a) for i in range(a.n_layers)})
        self.norm = nn.RMSNorm(a.dim)
        self.output = nn.Linear(a.dim, a.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for block in self.layers.values():
            h = block(h)
        logits: torch.Tensor = self.output(self.norm(h))
        return logits

    def use_context_parallel_attention(self) -> None:
        """Declares that titan-core may split each sequence over ranks (parallelism.cp): every attention here goes
        through F.scaled_dot_product_attention (is_causal=True), which titan-core then computes across the ranks.
        This model encodes no positions; if you add rotary or learned ones, take ``positions=None`` in forward and
        use them: under cp they are each token's place in the whole sequence, not 0..local length."""

    def init_parameter(self, fqn: str, tensor: torch.Tensor, generator: torch.Generator) -> None:
        """Fill the full-shaped plain tensor of parameter ``fqn`` (titan-core seeds ``generator`` per name)."""
        if fqn.endswith("norm.weight"):
            tensor.fill_(1.0)
        elif fqn.endswith(("wo.weight", "w2.weight")):
            # Layers writing into the residual stream start smaller, so its variance stays put.
            nn.init.normal_(tensor, std=0.02 / math.sqrt(2 * self.args.n_layers), generator=generator)
        else:
            nn.init.normal_(tensor, std=0.02, generator=generator)


def flops_per_token(a: TinyArgs, seq_len: int, *, full_attention: bool = False) -> float:
    """Training FLOPs per token: 6 x matmul weights + 12 x layers x dim x keys per query (causal
    attention computes about half the square; ``full_attention`` counts all of it)."""
    assert a.vocab_size is not None
    per_block = 4 * a.dim * a.dim + 3 * a.dim * a.hidden
    keys_per_query = seq_len if full_attention else (seq_len + 1) / 2
    return 6.0 * (a.n_layers * per_block + a.dim * a.vocab_size) + 12.0 * a.n_layers * a.dim * keys_per_query

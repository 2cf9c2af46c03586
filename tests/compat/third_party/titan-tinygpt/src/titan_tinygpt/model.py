"""TinyGPT: a small GPT-2-style decoder, in one file, top to bottom.

Features:
  * learned token and position embeddings, summed;
  * pre-norm blocks with LayerNorm (weight and bias) and a final LayerNorm;
  * standard multi-head causal self-attention through
    ``F.scaled_dot_product_attention(is_causal=True)`` (fused kernels, no mask tensor);
  * a GELU MLP of width ``mlp_ratio * dim``;
  * an untied output head (a separate weight is simpler to shard than one shared
    with the embedding);
  * buildable on the meta device; ``init_parameter`` gives every parameter its
    value from its name and a seeded generator, so the weights do not depend on
    the device or on how the model is sharded.

Nothing here knows about parallelism or the job config: ``parallelize.py`` wraps
the model, ``spec.py`` tells titan-core about it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class TinyGPTArgs:
    """Shape of a TinyGPT model. Frozen: derive variants with ``dataclasses.replace``."""

    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    vocab_size: int | None = None  # None: titan-core fills it from the tokenizer
    max_seq_len: int = 512  # rows of the position embedding; longer inputs are an error
    mlp_ratio: int = 4
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: softmax(q k^T / sqrt(d)) v over earlier positions."""

    def __init__(self, args: TinyGPTArgs) -> None:
        super().__init__()
        self.head_dim = args.head_dim
        # Separate q/k/v projections (not one fused qkv) so that a tensor-parallel
        # plan could shard each column-wise without splitting q from k from v.
        self.wq = nn.Linear(args.dim, args.dim)
        self.wk = nn.Linear(args.dim, args.dim)
        self.wv = nn.Linear(args.dim, args.dim)
        self.wo = nn.Linear(args.dim, args.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # [b, s, heads, head_dim] -> [b, heads, s, head_dim], the layout SDPA expects.
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    """fc_out(gelu(fc_in(x)))."""

    def __init__(self, args: TinyGPTArgs) -> None:
        super().__init__()
        self.fc_in = nn.Linear(args.dim, args.mlp_ratio * args.dim)
        self.fc_out = nn.Linear(args.mlp_ratio * args.dim, args.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(F.gelu(self.fc_in(x)))


class Block(nn.Module):
    """Pre-norm residual block: x + attn(ln_1(x)), then h + mlp(ln_2(h))."""

    def __init__(self, args: TinyGPTArgs) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(args.dim, eps=args.norm_eps)
        self.attn = CausalSelfAttention(args)
        self.ln_2 = nn.LayerNorm(args.dim, eps=args.norm_eps)
        self.mlp = MLP(args)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attn(self.ln_1(x))
        return h + self.mlp(self.ln_2(h))


class TinyGPT(nn.Module):
    """Token ids [batch, seq] -> logits [batch, seq, vocab]."""

    def __init__(self, args: TinyGPTArgs) -> None:
        super().__init__()
        if args.vocab_size is None:
            raise ValueError("TinyGPTArgs.vocab_size is None: set it (titan-core fills it from the tokenizer)")
        if args.dim % args.n_heads:
            raise ValueError(f"TinyGPTArgs: dim={args.dim} is not divisible by n_heads={args.n_heads}")
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.pos_embeddings = nn.Embedding(args.max_seq_len, args.dim)
        # A ModuleDict keyed "0".."n-1" gives parameter names like layers.0.attn.wq.weight,
        # the same as a ModuleList would, and keeps them if blocks are ever removed.
        self.layers = nn.ModuleDict({str(i): Block(args) for i in range(args.n_layers)})
        self.norm = nn.LayerNorm(args.dim, eps=args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq_len = tokens.shape[1]
        if seq_len > self.args.max_seq_len:
            raise ValueError(f"sequence length {seq_len} exceeds TinyGPTArgs.max_seq_len={self.args.max_seq_len}")
        # Positions are made here rather than kept as a buffer: nothing to recompute after to_empty.
        positions = torch.arange(seq_len, device=tokens.device)
        h = self.tok_embeddings(tokens) + self.pos_embeddings(positions)
        for block in self.layers.values():
            h = block(h)
        return self.output(self.norm(h))

    def init_parameter(self, fqn: str, tensor: torch.Tensor, generator: torch.Generator) -> None:
        """Fill ``tensor`` (full-shaped, plain, on the CPU) with the initial value of parameter ``fqn``.

        titan-core calls this once per parameter after ``to_empty``, with a generator
        seeded from (seed, fqn). The value depends only on the name, so a sharded,
        checkpointed or compiled model starts from exactly the weights of a plain one.
        """
        *path, leaf = fqn.split(".")
        owner = path[-1] if path else ""
        if owner in ("ln_1", "ln_2", "norm") and leaf == "weight":
            nn.init.ones_(tensor)
        elif leaf == "bias":
            nn.init.zeros_(tensor)
        elif owner in ("tok_embeddings", "pos_embeddings", "wq", "wk", "wv", "fc_in", "output"):
            nn.init.normal_(tensor, mean=0.0, std=0.02, generator=generator)
        elif owner in ("wo", "fc_out"):
            # GPT-2's rule: layers that write into the residual stream start smaller, so
            # the stream's variance does not grow with depth.
            nn.init.normal_(tensor, mean=0.0, std=0.02 / math.sqrt(2 * self.args.n_layers), generator=generator)
        else:
            raise ValueError(f"TinyGPT.init_parameter: no init rule for parameter {fqn!r}")


def matmul_params(args: TinyGPTArgs) -> int:
    """Weights that take part in matrix multiplies (all Linear weights; embeddings are lookups)."""
    assert args.vocab_size is not None, "matmul_params needs vocab_size"
    d = args.dim
    per_block = 4 * d * d + 2 * args.mlp_ratio * d * d
    return args.n_layers * per_block + d * args.vocab_size


def flops_per_token(args: TinyGPTArgs, seq_len: int, *, full_attention: bool = False) -> float:
    """Training FLOPs per token: 6 x matmul weights + 12 x layers x dim x keys per query.

    Forward plus backward is 3 passes of 2 FLOPs per weight per token; the second
    term is attention's two score/value matmuls. Causal attention computes (seq_len + 1) / 2
    keys per query on average; ``full_attention=True`` counts the full square instead.
    """
    keys_per_query = seq_len if full_attention else (seq_len + 1) / 2
    return 6.0 * matmul_params(args) + 12.0 * args.n_layers * args.dim * keys_per_query

"""Qwen3 and Qwen3-MoE decoder-only transformers, in one file.

Features:
  * pre-norm residual blocks (RMSNorm before attention and before the MLP) and a final norm;
  * grouped-query attention with an explicit ``head_dim`` (not dim / heads: Qwen3 uses 128
    everywhere), and QK-norm: an RMSNorm over each head's channels of q and k before RoPE;
  * rotary embeddings in the "rotate half" layout (channel i turns with channel
    i + head_dim/2), the layout of the published weights, so they load without permutation;
  * dense layers: a SwiGLU MLP; sparse layers (Qwen3-MoE): ``titan_core.moe.MoE``, a top-k
    softmax router (``norm_topk_prob`` renormalises the k weights) over experts stored as
    stacked weights, with optional shared experts. Which layers are sparse follows Hugging
    Face: layer i is sparse when ``num_experts > 0``, i is not in ``mlp_only_layers`` and
    (i + 1) is a multiple of ``decoder_sparse_step``;
  * packed windows of several documents (``forward(tokens, positions=...)``, the core's
    ``data.document_masking``): RoPE at each token's position in its document and
    block-causal attention (no token sees another document), still through
    ``F.scaled_dot_product_attention``, then with a boolean mask;
  * an output head of its own or tied to the embedding (``tie_embeddings``);
  * a forward that tolerates the pipeline splitter removing ``tok_embeddings`` (a later
    stage receives hidden states) or ``norm`` and ``output`` (an earlier stage returns them);
  * buildable on the meta device; weights filled per parameter name (``init_parameter``).

Nothing here knows about parallelism: ``tp_plan.py`` shards the dense parts and leaves the MoE
blocks whole, and expert parallelism comes from ``titan_core.moe``'s blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from titan_core.models.decoder import DecoderModel, RMSNorm, decoder_flops_per_token, decoder_parameter_counts
from titan_core.models.model_parts import FeedForward, final_norm_and_head
from titan_core.moe import MoE, is_moe_layer, reset_routers

try:  # an optional capability of the core (QK-clip, layer statistics): a core without it gets no logits
    from titan_core.models import attention_logits as _logits
except ImportError:  # pragma: no cover - an older titan-core
    _logits = None  # type: ignore[assignment]


@dataclass(frozen=True)
class Qwen3Args:
    """Shape of a Qwen3 model (dense when ``num_experts == 0``). Frozen: derive with ``dataclasses.replace``."""

    dim: int = 1024
    n_layers: int = 28
    n_heads: int = 16
    n_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int | None = None  # None: filled from the tokenizer by the core
    intermediate_size: int = 3072  # the dense MLP's hidden size
    norm_eps: float = 1e-6
    rope_theta: float = 1000000.0
    max_seq_len: int = 4096  # length of the rotary table
    tie_embeddings: bool = False
    # Mixture of experts (Qwen3-MoE); 0 experts: every layer dense.
    num_experts: int = 0
    num_experts_per_tok: int = 8
    moe_intermediate_size: int = 768  # each expert's hidden size
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    shared_expert_intermediate_size: int = 0  # 0: no shared experts
    # Load balancing: the auxiliary loss's coefficient, and DeepSeek-V3's bias update rate.
    moe_aux_loss_coeff: float = 0.0
    moe_bias_update_rate: float = 0.0

    def __post_init__(self) -> None:
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"Qwen3Args: n_heads={self.n_heads} is not divisible by n_kv_heads={self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"Qwen3Args: head_dim={self.head_dim} must be even for rotary embeddings")
        if self.num_experts and not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ValueError(f"Qwen3Args: num_experts_per_tok={self.num_experts_per_tok} must be between 1 and "
                             f"num_experts={self.num_experts}")
        if self.decoder_sparse_step < 1:
            raise ValueError(f"Qwen3Args: decoder_sparse_step={self.decoder_sparse_step} must be 1 or more")
        outside = [i for i in self.mlp_only_layers if not 0 <= i < self.n_layers]
        if outside:
            raise ValueError(f"Qwen3Args: mlp_only_layers names layer {outside[0]}, but the layers are numbered 0.."
                             f"{self.n_layers - 1} (n_layers={self.n_layers}); list only existing layers")
        repeated = next((i for n, i in enumerate(self.mlp_only_layers) if i in self.mlp_only_layers[:n]), None)
        if repeated is not None:
            raise ValueError(f"Qwen3Args: mlp_only_layers names layer {repeated} more than once "
                             f"({list(self.mlp_only_layers)}); list each layer once")
        # Settings only MoE layers read, given to a dense shape, would be ignored without a word.
        moe_only = [f"{name}={getattr(self, name)!r}" for name, default in
                    (("moe_aux_loss_coeff", 0.0), ("moe_bias_update_rate", 0.0), ("mlp_only_layers", ()))
                    if getattr(self, name) != default]
        if not self.num_experts and moe_only:
            raise ValueError(f"Qwen3Args: {', '.join(moe_only)} only act on MoE layers, and this shape has none "
                             f"(num_experts=0, a dense flavor): the setting would do nothing. Use a MoE flavor "
                             f"(e.g. debugmoe), or leave it out")
        if self.num_experts and not any(self.is_sparse(i) for i in range(self.n_layers)):
            # A MoE shape with no MoE layer is a dense model in disguise (and expert settings would do nothing).
            raise ValueError(f"Qwen3Args: with decoder_sparse_step={self.decoder_sparse_step} and mlp_only_layers="
                             f"{list(self.mlp_only_layers)} none of the {self.n_layers} layers has experts; make a "
                             f"layer sparse, or use a dense flavor (num_experts=0)")

    def is_sparse(self, layer_id: int) -> bool:
        """Whether layer ``layer_id`` is a MoE layer (Hugging Face's rule)."""
        return is_moe_layer(layer_id, num_experts=self.num_experts, sparse_step=self.decoder_sparse_step,
                            dense_layers=self.mlp_only_layers)


def rope_table(args: Qwen3Args, device: torch.device | None = None) -> torch.Tensor:
    """cos and sin of pos * freq for every position below ``max_seq_len``: [2, max_seq_len, head_dim]."""
    # On meta (how the trainer builds every model) only the shape exists: computing the table there would
    # run torch's Python reference kernels, whose first use imports torch._dynamo (about 1 s of CPU on every
    # rank). init_buffers() computes it on the real device.
    if torch.empty(0, device=device).is_meta:
        return torch.empty(2, args.max_seq_len, 2 * len(range(0, args.head_dim, 2)), dtype=torch.float32, device=device)
    freqs = 1.0 / (args.rope_theta ** (torch.arange(0, args.head_dim, 2, device=device, dtype=torch.float32)
                                       / args.head_dim))
    angles = torch.outer(torch.arange(args.max_seq_len, device=device, dtype=torch.float32), freqs)
    angles = torch.cat([angles, angles], dim=-1)  # rotate-half: both halves turn at the same speeds
    return torch.stack([angles.cos(), angles.sin()])


def apply_rope(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [b, s, heads, head_dim]: channel i with channel i + head_dim/2.

    ``table`` is the whole table ([2, max_seq_len, head_dim], row = position 0, 1, ...), or with
    packed documents each token's own rows already gathered ([2, b, s, head_dim]).
    """
    if table.dim() == 4:  # per token, at its position in its document
        cos, sin = table[0, :, :, None, :], table[1, :, :, None, :]
    else:
        seqlen = x.shape[1]
        if seqlen > table.shape[1]:
            raise ValueError(f"sequence length {seqlen} exceeds the rotary table's max_seq_len {table.shape[1]}")
        cos, sin = table[0, :seqlen, None, :], table[1, :seqlen, None, :]
    first, second = x.chunk(2, dim=-1)
    rotated = torch.cat([-second, first], dim=-1)
    return (x.float() * cos + rotated.float() * sin).type_as(x)


def document_mask(positions: torch.Tensor) -> torch.Tensor:
    """The block-causal mask of packed documents, bool [b, 1, s, s], True where a query may see a key.

    ``positions`` [b, s] restart at 0 at each document's first token, so token i's document starts at
    ``i - positions[i]``; key j is visible to query i when ``start(i) <= j <= i``.
    """
    index = torch.arange(positions.shape[1], device=positions.device)
    starts = index - positions.long()  # [b, s]
    visible = (index[None, :] <= index[:, None]) & (index[None, None, :] >= starts[:, :, None])
    return visible[:, None]


class Attention(nn.Module):
    """Causal grouped-query attention with per-head QK-norm and rotary embeddings."""

    def __init__(self, args: Qwen3Args) -> None:
        super().__init__()
        self.head_dim = args.head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)
        self.q_norm = RMSNorm(args.head_dim, args.norm_eps)
        self.k_norm = RMSNorm(args.head_dim, args.norm_eps)

    def forward(self, x: torch.Tensor, rope: torch.Tensor, *, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``mask`` (bool [b, 1, s, s], packed documents): the keys each query may see; None: plain causal.
        Keyword-only: tensor parallelism gives a layout to each positional input."""
        bs, seqlen, _ = x.shape
        # Head counts come from the weights (a sharded weight holds fewer heads), not from args.
        q = self.q_norm(self.wq(x).view(bs, seqlen, -1, self.head_dim))
        k = self.k_norm(self.wk(x).view(bs, seqlen, -1, self.head_dim))
        v = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        if _logits is not None and _logits.attention_logits_requested():  # asked by the core: nothing otherwise
            # A block-causal mask's first visible key of each query is its document's start.
            starts = None if mask is None else mask[:, 0].int().argmax(dim=-1)
            _logits.record_attention_logits(self, q, k, q_proj=self.wq, k_proj=self.wk, starts=starts,
                                            norms=(self.q_norm, self.k_norm))
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        gqa = k.shape[1] != q.shape[1]
        # Both through SDPA (context parallelism intercepts that call); a mask takes a kernel that reads one.
        if mask is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        return self.wo(out.transpose(1, 2).reshape(bs, seqlen, -1))


class TransformerBlock(nn.Module):
    """x + attention(norm(x)), then h + mlp(norm(h)); the MLP is ``feed_forward`` (dense) or ``moe``."""

    def __init__(self, args: Qwen3Args, layer_id: int) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward: FeedForward | None = None
        self.moe: MoE | None = None
        if args.is_sparse(layer_id):
            shared = (FeedForward(args.dim, args.shared_expert_intermediate_size)
                      if args.shared_expert_intermediate_size else None)
            self.moe = MoE(args.dim, args.moe_intermediate_size, args.num_experts, args.num_experts_per_tok,
                           norm_topk_prob=args.norm_topk_prob, aux_loss_coeff=args.moe_aux_loss_coeff,
                           bias_update_rate=args.moe_bias_update_rate, shared_experts=shared)
        else:
            self.feed_forward = FeedForward(args.dim, args.intermediate_size)

    def forward(self, x: torch.Tensor, rope: torch.Tensor, *, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope, mask=mask)
        mlp = self.moe if self.moe is not None else self.feed_forward
        assert mlp is not None  # one of the two is built
        return h + mlp(self.ffn_norm(h))


class Transformer(DecoderModel):
    """Token ids [b, s] -> logits [b, s, vocab]."""

    rope: torch.Tensor  # cos/sin table, a non-persistent buffer

    def __init__(self, args: Qwen3Args) -> None:
        super().__init__(args, lambda i: TransformerBlock(args, i), RMSNorm(args.dim, args.norm_eps))
        self.register_buffer("rope", rope_table(args), persistent=False)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """``positions`` (int [b, s], optional): each token's position in its document, 0 at every
        document's first token. Given, a row holds several documents back to back: none attends to
        another, and RoPE turns by these positions. None: one sequence per row, plain causal.
        A later pipeline stage receives hidden states [b, s, dim] as ``tokens``, and the same positions."""
        # Without tok_embeddings this is a later pipeline stage: the input is hidden states.
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        rope, mask = self.rope, None
        if positions is not None:
            if positions.shape != tokens.shape[:2]:
                raise ValueError(f"positions {tuple(positions.shape)} are not [batch, seq] = {tuple(tokens.shape[:2])} "
                                 f"of the input {tuple(tokens.shape)}: pass one position per token (int [b, s], 0 "
                                 f"at each document's first token)")
            if positions.is_floating_point() or positions.is_complex() or positions.dtype == torch.bool:
                raise ValueError(f"positions are {positions.dtype}: they must be integers (each token's index in "
                                 f"its document)")
            rope = self.rope[:, positions]  # [2, b, s, head_dim]; an out-of-table position is an IndexError here
            mask = document_mask(positions)  # built once, for every layer
        for layer in self.layers.values():
            h = layer(h, rope, mask=mask)
        return final_norm_and_head(h, self.norm, self.output)

    # tied_weights, init_parameter (the untied embedding at unit scale), init_weights: DecoderModel's.

    def use_context_parallel_attention(self) -> None:
        """Declares context-parallelism support (the core's ``parallelism.cp``): every attention here already goes
        through ``F.scaled_dot_product_attention`` (causal, or with the block-causal mask of ``positions``), which the
        core then computes across the ranks that hold parts of the sequence. Nothing to change."""

    def init_buffers(self) -> None:
        """Recompute the rotary table on its device and start every router unbiased (after ``to_empty``)."""
        self.rope = rope_table(self.args, self.rope.device)
        reset_routers(self)


def parameter_counts(args: Qwen3Args) -> tuple[int, int]:
    """(total, active per token) parameters, embedding and head included (a tied head counted once)."""
    if args.vocab_size is None:
        raise ValueError("parameter_counts: Qwen3Args.vocab_size is None; fill it first")
    d, hd = args.dim, args.head_dim
    attention = d * hd * (2 * args.n_heads + 2 * args.n_kv_heads) + 2 * hd + 2 * d  # + QK-norms, block norms
    return decoder_parameter_counts(
        vocab_size=args.vocab_size, dim=d, tie_embeddings=args.tie_embeddings, attention=attention,
        sparse=[args.is_sparse(i) for i in range(args.n_layers)], dense_hidden=args.intermediate_size,
        num_experts=args.num_experts, experts_per_token=args.num_experts_per_tok,
        expert_hidden=args.moe_intermediate_size, shared_hidden=args.shared_expert_intermediate_size)


def flops_per_token(args: Qwen3Args, seq_len: int, *, full_attention: bool = False) -> float:
    """Training FLOPs per token: 6 x active non-embedding parameters (head included) + attention's matmuls."""
    if args.vocab_size is None:
        raise ValueError("flops_per_token: Qwen3Args.vocab_size is None; fill it from the tokenizer first")
    _, active = parameter_counts(args)
    return decoder_flops_per_token(active, vocab_size=args.vocab_size, dim=args.dim, tie_embeddings=args.tie_embeddings,
                                   seq_len=seq_len, full_attention=full_attention,
                                   attention_per_key=12.0 * args.n_layers * args.n_heads * args.head_dim)

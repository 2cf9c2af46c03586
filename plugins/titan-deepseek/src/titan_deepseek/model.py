"""DeepSeek-V3 (and Moonlight, Kimi K2: the same architecture), in one file.

Features:
  * pre-norm residual blocks (RMSNorm before attention and before the MLP) and a final norm;
  * multi-head latent attention (MLA): the query goes through a low-rank bottleneck
    (``q_lora_rank``; 0: one plain projection, as Moonlight), keys and values share one
    compressed latent of ``kv_lora_rank`` channels, and position is carried by a separate
    ``qk_rope_head_dim``-channel part of each query and of one key shared by every head
    (the "decoupled" RoPE); the rest of each head (``qk_nope_head_dim``) has no position.
    Values have their own width, ``v_head_dim``;
  * rotary embeddings on the decoupled part in DeepSeek's interleaved layout (channel 2i turns
    with channel 2i + 1, ``rope_interleave``) or in the "rotate half" layout, with YaRN
    context extension as transformers reads it (``rope_type="yarn"``): blended frequencies,
    the cos/sin table scaled by the attention factor, and the softmax scale by mscale squared;
  * the first ``first_k_dense_replace`` layers have a dense SwiGLU MLP, the others
    ``titan_core.moe.MoE``: sigmoid scores, group-limited top-k (``n_group``, ``topk_group``),
    renormalised weights times ``routed_scaling_factor``, ``n_shared_experts`` shared experts,
    the auxiliary-loss-free routing bias and the optional sequence-wise auxiliary loss;
  * optional multi-token prediction at depth 1 (``mtp_layers=1``): one more block, stored as layer
    ``n_layers`` as the published checkpoints store it, reads the last block's hidden state at each
    position i beside the embedding of token i + 1 and predicts token i + 2 through the shared output
    head; in training forwards (which pass ``labels``) its cross-entropy, times ``mtp_loss_weight``,
    joins the training loss (a ``titan_core.LossTerm``); the main logits never depend on it;
  * an optional latent cache for sampling (``forward(tokens, cache=...)``, the contract of
    ``titan_core.KVCache``): each layer caches its key/value latent and its rotary key
    (``kv_lora_rank + qk_rope_head_dim`` numbers per token), and expands them per step;
  * a forward that tolerates the pipeline splitter removing ``tok_embeddings`` (a later
    stage receives hidden states) or ``norm`` and ``output`` (an earlier stage returns them);
  * buildable on the meta device; weights filled per parameter name (``init_parameter``).

Shapes: ``B`` batch, ``S`` sequence, ``D`` model dim, ``H`` heads, ``R`` rotary channels per
head, ``N`` non-rotary query/key channels per head, ``V`` value channels per head, ``C`` the
key/value latent (``kv_lora_rank``), ``Q`` the query latent (``q_lora_rank``).

Nothing here knows about parallelism.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from titan_core.models.attention_logits import DecoupledRope, record_attention_logits
from titan_core.models.decoder import DecoderModel, RMSNorm, decoder_flops_per_token, decoder_parameter_counts
from titan_core.models.loss import IGNORE_INDEX
from titan_core.models.loss_terms import LossTerm
from titan_core.models.model_parts import FeedForward, final_norm_and_head, trunc_normal_
from titan_core.moe import MoE, check_routing, is_moe_layer, reset_routers

if TYPE_CHECKING:
    from titan_core.models.kv_cache import KVCache, LayerCache

# transformers builds the two latent norms with RMSNorm's default epsilon, whatever rms_norm_eps says.
LATENT_NORM_EPS = 1e-6


# The fields only MoE layers read: a dense shape (n_routed_experts=0) must leave them at their defaults.
MOE_ONLY_FIELDS = frozenset({
    "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts", "first_k_dense_replace", "n_group",
    "topk_group", "routed_scaling_factor", "norm_topk_prob", "score_func", "moe_aux_loss_coeff",
    "moe_bias_update_rate",
})


@dataclass(frozen=True)
class DeepSeekV3Args:
    """Shape of a DeepSeek-V3 model (dense when ``n_routed_experts == 0``). Frozen: derive with ``dataclasses.replace``."""

    dim: int = 2048
    n_layers: int = 27
    n_heads: int = 16
    vocab_size: int | None = None  # None: filled from the tokenizer by the core
    intermediate_size: int = 10944  # the dense MLP's hidden size
    norm_eps: float = 1e-6
    max_seq_len: int = 4096  # length of the rotary table
    tie_embeddings: bool = False
    # Multi-head latent attention.
    q_lora_rank: int = 0  # 0: the query is one projection, no bottleneck
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    # Rotary embeddings; rope_type "yarn" uses the rope_* scaling fields below (transformers' names).
    rope_theta: float = 10000.0
    rope_interleave: bool = True
    rope_type: str = "default"
    rope_factor: float = 1.0
    rope_original_max_seq_len: int = 4096
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0
    rope_mscale: float = 0.0  # 0: unset
    rope_mscale_all_dim: float = 0.0  # 0: unset
    rope_attention_factor: float = 0.0  # 0: derived from factor and the mscales
    rope_truncate: bool = True
    # Mixture of experts; 0 routed experts: every layer dense.
    n_routed_experts: int = 0
    num_experts_per_tok: int = 6
    moe_intermediate_size: int = 1408  # each expert's hidden size
    n_shared_experts: int = 0  # shared experts, each moe_intermediate_size wide (fused into one MLP)
    first_k_dense_replace: int = 0
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    norm_topk_prob: bool = True
    score_func: str = "sigmoid"
    # Load balancing: the sequence-wise auxiliary loss's coefficient, and the routing-bias update rate.
    moe_aux_loss_coeff: float = 0.0
    moe_bias_update_rate: float = 0.0
    # Multi-token prediction: 0 or 1 extra block (DeepSeek-V3's depth 1) and its loss weight (the paper's
    # lambda: 0.3 for most of the run, 0.1 at the end).
    mtp_layers: int = 0
    mtp_loss_weight: float = 0.3

    def __post_init__(self) -> None:
        if self.mtp_layers not in (0, 1):
            raise ValueError(f"DeepSeekV3Args: mtp_layers={self.mtp_layers}; multi-token prediction has depth 0 "
                             f"(off) or 1, as DeepSeek-V3")
        if not (math.isfinite(self.mtp_loss_weight) and self.mtp_loss_weight >= 0):
            raise ValueError(f"DeepSeekV3Args: mtp_loss_weight={self.mtp_loss_weight} must be a finite number >= 0")
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"DeepSeekV3Args: qk_rope_head_dim={self.qk_rope_head_dim} must be even for rotary "
                             f"embeddings")
        if self.rope_type not in ("default", "yarn"):
            raise ValueError(f"DeepSeekV3Args: rope_type={self.rope_type!r} is not one of default, yarn")
        self._check_rope()
        if self.n_routed_experts:
            check_routing(self.n_routed_experts, self.num_experts_per_tok, score_func=self.score_func,
                          n_group=self.n_group, topk_group=self.topk_group)
            if self.first_k_dense_replace >= self.n_layers:
                raise ValueError(f"DeepSeekV3Args: first_k_dense_replace={self.first_k_dense_replace} leaves none "
                                 f"of the {self.n_layers} layers with experts; lower it or use a dense flavor "
                                 f"(n_routed_experts=0)")
        else:
            # Settings only MoE layers read, given to a dense shape, would be ignored without a word (identical
            # losses). Only values that differ from the field's default: a flavor or a config.json that merely
            # carries the default still loads.
            moe_only = [f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                        if f.name in MOE_ONLY_FIELDS and getattr(self, f.name) != f.default]
            if moe_only:
                raise ValueError(f"DeepSeekV3Args: {', '.join(moe_only)} only act on MoE layers, and this shape has "
                                 f"none (n_routed_experts=0, a dense flavor): the setting would do nothing. Use a "
                                 f"MoE flavor (e.g. debugmoe), or leave it out")

    def _check_rope(self) -> None:
        """ValueError for rotary settings that would crash the table's computation or silently mean something
        else. Here, not in the config section, so flags, flavors and Hugging Face config.json files all pass."""
        if not (math.isfinite(self.rope_theta) and self.rope_theta > 0):
            raise ValueError(f"DeepSeekV3Args: rope_theta={self.rope_theta} must be a finite number > 0: the rotary "
                             f"frequencies are powers of it (DeepSeek-V3 uses 10000)")
        if self.rope_type != "yarn":
            return
        # yarn's correction range divides by log(rope_theta): 0 at 1 (ZeroDivisionError when the table is
        # built, at the first sample or step), and below 1 it turns the ramp around.
        if self.rope_theta <= 1:
            raise ValueError(f"DeepSeekV3Args: rope_theta={self.rope_theta} with rope_type='yarn': yarn's correction "
                             f"range divides by log(rope_theta), which is 0 at 1 and negative below; give a "
                             f"rope_theta above 1 (DeepSeek-V3 uses 10000), or rope_type='default'")
        # below 1 yarn would shorten the wavelengths it is meant to stretch (transformers warns likewise)
        if not (math.isfinite(self.rope_factor) and self.rope_factor >= 1):
            raise ValueError(f"DeepSeekV3Args: rope_factor={self.rope_factor} (config.json: rope_scaling.factor) "
                             f"with rope_type='yarn': yarn stretches the original context by this factor, so it "
                             f"must be a finite number >= 1 (DeepSeek-V3 uses 40); use rope_type='default' for no "
                             f"stretch")
        if self.rope_original_max_seq_len < 1:
            raise ValueError(f"DeepSeekV3Args: rope_original_max_seq_len={self.rope_original_max_seq_len} "
                             f"(config.json: original_max_position_embeddings) must be 1 or more: yarn takes the "
                             f"logarithm of the original context length (DeepSeek-V3 uses 4096)")
        # Each beta is a number of turns that yarn divides by, and then takes the logarithm of the quotient.
        for name in ("rope_beta_fast", "rope_beta_slow"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"DeepSeekV3Args: {name}={value} (config.json: {name.removeprefix('rope_')}) must "
                                 f"be a finite number > 0: yarn divides by it (DeepSeek-V3 uses beta_fast=32, "
                                 f"beta_slow=1)")
        if self.rope_beta_fast < self.rope_beta_slow:
            # The ramp would run backwards: stretch the fast channels and keep the slow ones.
            raise ValueError(f"DeepSeekV3Args: rope_beta_fast={self.rope_beta_fast} is below rope_beta_slow="
                             f"{self.rope_beta_slow}: yarn keeps the channels turning more than beta_fast times and "
                             f"stretches those turning fewer than beta_slow times, so beta_fast must be the larger "
                             f"(DeepSeek-V3 uses 32 and 1); swap them")
        # 0 means unset for these three (as transformers reads mscale); a negative one would make the attention
        # temperature 0 (a division by zero) or flip the sign of the rotary table.
        for name in ("rope_mscale", "rope_mscale_all_dim", "rope_attention_factor"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"DeepSeekV3Args: {name}={value} (config.json: {name.removeprefix('rope_')}) must "
                                 f"be a finite number >= 0 (0: unset); DeepSeek-V3 uses mscale=1, mscale_all_dim=1")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def is_sparse(self, layer_id: int) -> bool:
        """Whether layer ``layer_id`` is a MoE layer (the first ``first_k_dense_replace`` are dense)."""
        return is_moe_layer(layer_id, num_experts=self.n_routed_experts, first_k_dense=self.first_k_dense_replace)


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature: 0.1 mscale ln(factor) + 1 (1 when not stretched)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_frequencies(args: DeepSeekV3Args, device: torch.device | None = None) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [R/2], the factor cos and sin are scaled by), as transformers computes them."""
    dim, base = args.qk_rope_head_dim, args.rope_theta
    exponents = torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim
    if args.rope_type == "default":
        return 1.0 / (base ** exponents), 1.0
    factor = args.rope_factor
    if args.rope_attention_factor:
        attention_factor = args.rope_attention_factor
    elif args.rope_mscale and args.rope_mscale_all_dim:
        attention_factor = _yarn_mscale(factor, args.rope_mscale) / _yarn_mscale(factor, args.rope_mscale_all_dim)
    else:
        attention_factor = _yarn_mscale(factor)

    def correction_dim(rotations: float) -> float:
        """The channel whose wavelength fits ``rotations`` turns into the original context."""
        return dim * math.log(args.rope_original_max_seq_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(args.rope_beta_fast), correction_dim(args.rope_beta_slow)
    if args.rope_truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no division by zero in the ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1).to(device)
    positional = base ** exponents
    keep = 1 - ramp  # 1: the channel keeps its frequency (extrapolates), 0: it is stretched by factor
    inv_freq = (1.0 / (factor * positional)) * (1 - keep) + (1.0 / positional) * keep
    return inv_freq, attention_factor


def softmax_scale(args: DeepSeekV3Args) -> float:
    """qk_head_dim^-0.5, times YaRN's mscale(factor, mscale_all_dim) squared when stretched."""
    scale = args.qk_head_dim ** -0.5
    if args.rope_type != "default" and args.rope_mscale_all_dim:
        mscale = _yarn_mscale(args.rope_factor, args.rope_mscale_all_dim)
        scale = scale * mscale * mscale
    return scale


def rope_table(args: DeepSeekV3Args, device: torch.device | None = None) -> torch.Tensor:
    """cos and sin of pos * freq (times the attention factor) for every position: [2, max_seq_len, R/2]."""
    # On meta (how the trainer builds every model) only the shape exists: computing the table there would
    # run torch's Python reference kernels, whose first use imports torch._dynamo (about 1 s of CPU on every
    # rank). init_buffers() computes it on the real device.
    if torch.empty(0, device=device).is_meta:
        return torch.empty(2, args.max_seq_len, len(range(0, args.qk_rope_head_dim, 2)), dtype=torch.float32,
                           device=device)
    inv_freq, attention_factor = rope_frequencies(args, device)
    angles = torch.outer(torch.arange(args.max_seq_len, device=device, dtype=torch.float32), inv_freq)
    return torch.stack([angles.cos() * attention_factor, angles.sin() * attention_factor])


def apply_rope(x: torch.Tensor, table: torch.Tensor, *, interleave: bool, start: int = 0) -> torch.Tensor:
    """Rotate ``x`` [B, S, heads, R] at positions start .. start + S - 1.

    Interleaved: channels (2i, 2i + 1) turn together, and the result lists the first of each
    pair, then the second (transformers' layout: attention only takes dot products, which a
    permutation shared by queries and keys leaves unchanged). Otherwise channel i turns with
    channel i + R/2.
    """
    seqlen = x.shape[1]
    if start + seqlen > table.shape[1]:
        raise ValueError(f"sequence length {start + seqlen} exceeds the rotary table's max_seq_len {table.shape[1]}")
    cos, sin = table[0, start:start + seqlen, None, :], table[1, start:start + seqlen, None, :]
    if interleave:
        first, second = x[..., 0::2], x[..., 1::2]
    else:
        first, second = x.chunk(2, dim=-1)
    first, second = first.float(), second.float()
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1).type_as(x)


class MultiHeadLatentAttention(nn.Module):
    """Causal MLA: queries through ``wq`` (or ``wq_a`` -> ``q_norm`` -> ``wq_b``), keys and values
    expanded by ``wkv_b`` from the normed latent that ``wkv_a`` writes beside the shared rotary key."""

    def __init__(self, args: DeepSeekV3Args) -> None:
        super().__init__()
        self.nope_dim, self.rope_dim, self.v_dim = args.qk_nope_head_dim, args.qk_rope_head_dim, args.v_head_dim
        self.kv_lora_rank = args.kv_lora_rank
        self.interleave = args.rope_interleave
        self.scale = softmax_scale(args)
        qk_width = args.n_heads * args.qk_head_dim
        self.wq: nn.Linear | None = None
        self.wq_a: nn.Linear | None = None
        self.q_norm: RMSNorm | None = None
        self.wq_b: nn.Linear | None = None
        if args.q_lora_rank:
            self.wq_a = nn.Linear(args.dim, args.q_lora_rank, bias=False)
            self.q_norm = RMSNorm(args.q_lora_rank, LATENT_NORM_EPS)
            self.wq_b = nn.Linear(args.q_lora_rank, qk_width, bias=False)
        else:
            self.wq = nn.Linear(args.dim, qk_width, bias=False)
        self.wkv_a = nn.Linear(args.dim, args.kv_lora_rank + args.qk_rope_head_dim, bias=False)
        self.kv_norm = RMSNorm(args.kv_lora_rank, LATENT_NORM_EPS)
        self.wkv_b = nn.Linear(args.kv_lora_rank, args.n_heads * (args.qk_nope_head_dim + args.v_head_dim), bias=False)
        self.wo = nn.Linear(args.n_heads * args.v_head_dim, args.dim, bias=False)

    def queries(self, x_BSD: torch.Tensor) -> torch.Tensor:
        """[B, S, H, N + R], before RoPE."""
        if self.wq is not None:
            q = self.wq(x_BSD)
        else:
            assert self.wq_a is not None and self.q_norm is not None and self.wq_b is not None
            q = self.wq_b(self.q_norm(self.wq_a(x_BSD)))
        return q.view(*x_BSD.shape[:2], -1, self.nope_dim + self.rope_dim)

    def latent(self, x_BSD: torch.Tensor, rope: torch.Tensor, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """What a token leaves for later ones: its normed key/value latent [B, S, C] and rotated key [B, S, 1, R]."""
        kv_BSC, k_rope_BSR = self.wkv_a(x_BSD).split([self.kv_lora_rank, self.rope_dim], dim=-1)
        k_rope_BS1R = apply_rope(k_rope_BSR.unsqueeze(2), rope, interleave=self.interleave, start=start)
        return self.kv_norm(kv_BSC), k_rope_BS1R

    def attend(self, q_BSHK: torch.Tensor, kv_BLC: torch.Tensor, k_rope_BL1R: torch.Tensor) -> torch.Tensor:
        """The S new queries (the last S of L positions) over the latents of all L positions -> [B, S, D]."""
        batch, length = kv_BLC.shape[:2]
        seqlen = q_BSHK.shape[1]
        kv_BLHX = self.wkv_b(kv_BLC).view(batch, length, -1, self.nope_dim + self.v_dim)
        k_nope_BLHN, v_BLHV = kv_BLHX.split([self.nope_dim, self.v_dim], dim=-1)
        k_BLHK = torch.cat([k_nope_BLHN, k_rope_BL1R.expand(-1, -1, k_nope_BLHN.shape[2], -1)], dim=-1)
        # SDPA's is_causal aligns the mask to the top left: right without a past; with one, one new
        # query sees every key, and several need the mask shifted by the past.
        past = length - seqlen
        if not past:  # each head's largest logit, when the core asks (QK-clip, per-layer figures); else nothing
            q_proj = self.wq if self.wq is not None else self.wq_b
            assert q_proj is not None  # one of the two is built
            record_attention_logits(self, q_BSHK, k_BLHK, q_proj=q_proj, k_proj=self.wkv_b, scale=self.scale,
                                    decoupled=DecoupledRope(self.nope_dim, self.rope_dim, self.v_dim))
        q, k, v = (t.transpose(1, 2) for t in (q_BSHK, k_BLHK, v_BLHV))
        mask = None
        if past and seqlen > 1:
            mask = torch.ones(seqlen, length, dtype=torch.bool, device=q.device).tril(diagonal=past)
        out_BHSV = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=not past and seqlen > 1,
                                                  scale=self.scale)
        return self.wo(out_BHSV.transpose(1, 2).reshape(batch, seqlen, -1))

    def forward(self, x_BSD: torch.Tensor, rope: torch.Tensor, cache: LayerCache | None = None,
                start: int = 0) -> torch.Tensor:
        """``cache`` (sampling only): this layer's latents of the ``start`` earlier positions; the new ones are
        added. It holds C + R numbers per position (the latent and the rotary key), not 2 x H heads of keys
        and values."""
        q_BSHK = self.queries(x_BSD)
        q_nope, q_rope = q_BSHK.split([self.nope_dim, self.rope_dim], dim=-1)
        q_BSHK = torch.cat([q_nope, apply_rope(q_rope, rope, interleave=self.interleave, start=start)], dim=-1)
        kv_BLC, k_rope_BL1R = self.latent(x_BSD, rope, start)
        if cache is not None:
            kv_BLC, k_rope_BL1R = cache.append(kv_BLC, k_rope_BL1R)
        return self.attend(q_BSHK, kv_BLC, k_rope_BL1R)


class TransformerBlock(nn.Module):
    """x + attention(norm(x)), then h + mlp(norm(h)); the MLP is ``feed_forward`` (dense) or ``moe``."""

    def __init__(self, args: DeepSeekV3Args, layer_id: int) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = MultiHeadLatentAttention(args)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward: FeedForward | None = None
        self.moe: MoE | None = None
        if args.is_sparse(layer_id):
            shared = (FeedForward(args.dim, args.moe_intermediate_size * args.n_shared_experts)
                      if args.n_shared_experts else None)
            self.moe = MoE(args.dim, args.moe_intermediate_size, args.n_routed_experts, args.num_experts_per_tok,
                           norm_topk_prob=args.norm_topk_prob, aux_loss_coeff=args.moe_aux_loss_coeff,
                           bias_update_rate=args.moe_bias_update_rate, shared_experts=shared,
                           score_func="sigmoid" if args.score_func == "sigmoid" else "softmax",
                           n_group=args.n_group, topk_group=args.topk_group,
                           routed_scaling_factor=args.routed_scaling_factor)
        else:
            self.feed_forward = FeedForward(args.dim, args.intermediate_size)

    def forward(self, x: torch.Tensor, rope: torch.Tensor, cache: LayerCache | None = None,
                start: int = 0) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope, cache, start)
        return h + self.mlp(self.ffn_norm(h))

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        block = self.moe if self.moe is not None else self.feed_forward
        assert block is not None  # one of the two is built
        out: torch.Tensor = block(x)
        return out


class SharedHead(nn.Module):
    """DeepSeek's ``shared_head``: the prediction block's final norm (its head is the main model's output)."""

    def __init__(self, args: DeepSeekV3Args) -> None:
        super().__init__()
        self.norm = RMSNorm(args.dim, args.norm_eps)


class MultiTokenPrediction(TransformerBlock, LossTerm):
    """Multi-token prediction at depth 1: a block whose input at position i joins the main model's last
    hidden state at i (``hnorm``) with the embedding of token i + 1 (``enorm``) through ``eh_proj``, and
    whose normed output (``shared_head.norm``) the main output head turns into logits for token i + 2.
    The block's forward ends at that norm, so activation checkpointing and FSDP2 treat it as any block;
    ``add_loss`` scores it outside (the head belongs to the main model)."""

    metric = "mtp_loss"

    def __init__(self, args: DeepSeekV3Args, layer_id: int) -> None:
        super().__init__(args, layer_id)
        self.enorm = RMSNorm(args.dim, args.norm_eps)
        self.hnorm = RMSNorm(args.dim, args.norm_eps)
        self.eh_proj = nn.Linear(2 * args.dim, args.dim, bias=False)
        self.shared_head = SharedHead(args)
        self.loss_weight = args.mtp_loss_weight

    def forward(self, h_BSD: torch.Tensor, next_embedded_BSD: torch.Tensor,  # type: ignore[override]
                rope: torch.Tensor) -> torch.Tensor:
        """[B, S, D]: position i from the hidden state of token i and the embedding of token i + 1. All S
        positions, the last one's target unknown: the token count stays the window's (MX needs it a
        multiple of 32), and no position attends to a later one."""
        x = self.eh_proj(torch.cat([self.enorm(next_embedded_BSD), self.hnorm(h_BSD)], dim=-1))
        out: torch.Tensor = self.shared_head.norm(super().forward(x, rope))
        return out

    def add_loss(self, x_BSD: torch.Tensor, labels: torch.Tensor, head: nn.Module) -> None:
        """Hand the weighted cross-entropy of token i + 2 (``labels[:, i + 1]``; none for the last position)
        to the trainer."""
        targets = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], IGNORE_INDEX)], dim=1)
        logits = head(x_BSD).float()
        summed = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX,
                                 reduction="sum")
        mean = summed / (targets != IGNORE_INDEX).sum().clamp(min=1)  # 0, not NaN, when nothing is valid
        self.add_to_loss(self.loss_weight * mean, reported=mean)


class Transformer(DecoderModel):
    """Token ids [B, S] -> logits [B, S, vocab]."""

    rope: torch.Tensor  # cos/sin table, a non-persistent buffer

    def __init__(self, args: DeepSeekV3Args) -> None:
        super().__init__(args, lambda i: TransformerBlock(args, i), RMSNorm(args.dim, args.norm_eps))
        if args.mtp_layers:  # layer n_layers, as DeepSeek-V3's checkpoint holds it (model.layers.61)
            self.layers[str(args.n_layers)] = MultiTokenPrediction(args, args.n_layers)
        self.register_buffer("rope", rope_table(args), persistent=False)

    def forward(self, tokens: torch.Tensor, *, labels: torch.Tensor | None = None,
                cache: KVCache | None = None) -> torch.Tensor:
        """``labels`` (training forwards only): with multi-token prediction, its loss is handed to the trainer.
        ``cache`` (sampling only, ``titan_core.KVCache``): ``tokens`` are the new tokens, at positions from
        ``cache.offset``; each layer caches its latents, not its keys and values."""
        embedded = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        h = embedded
        mtp = None
        for name, layer in self.layers.items():
            if int(name) >= self.args.n_layers:  # the prediction block reads the main stack's result
                mtp = layer
                continue
            h = layer(h, self.rope) if cache is None else layer(h, self.rope, cache.layer(name), cache.offset)
        if mtp is not None and labels is not None and self.output is not None and self.tok_embeddings is not None:
            assert isinstance(mtp, MultiTokenPrediction)
            # Token i + 1 for every position: the inputs' next, and for the last the first label (an ignored
            # one stands in as token 0: the last position has no target, and no position attends to it).
            next_tokens = torch.cat([tokens[:, 1:], labels[:, -1:].clamp(min=0)], dim=1)
            mtp.add_loss(mtp(h, self.tok_embeddings(next_tokens), self.rope), labels, self.output)
        return final_norm_and_head(h, self.norm, self.output)

    # tied_weights and init_weights: DecoderModel's.

    def init_parameter(self, fqn: str, tensor: torch.Tensor, generator: torch.Generator) -> None:
        """Fill ``tensor`` (full-shaped, plain) with the initial value of parameter ``fqn``."""
        owner = fqn.split(".")[-2] if fqn.count(".") else ""
        if owner in ("wq_a", "wq_b", "wkv_a", "wkv_b", "eh_proj"):  # input-side projections: as wq/wk/wv
            trunc_normal_(tensor, 0.02, generator)
        else:  # the rest as every decoder here (the untied embedding at unit scale)
            super().init_parameter(fqn, tensor, generator)

    def init_buffers(self) -> None:
        """Recompute the rotary table on its device and start every router unbiased (after ``to_empty``)."""
        self.rope = rope_table(self.args, self.rope.device)
        reset_routers(self)


def cache_bytes_per_token(args: DeepSeekV3Args, *, bytes_per_number: int = 4) -> tuple[int, int]:
    """(latent cache, the same model's cache with multi-head attention) bytes per token, all layers: the
    latent and rotary key, against every head's key (qk_head_dim) and value (v_head_dim)."""
    latent = args.n_layers * (args.kv_lora_rank + args.qk_rope_head_dim) * bytes_per_number
    mha = args.n_layers * args.n_heads * (args.qk_head_dim + args.v_head_dim) * bytes_per_number
    return latent, mha


def attention_parameters(args: DeepSeekV3Args) -> int:
    """Weights of one MLA block, its two latent norms included."""
    d, h = args.dim, args.n_heads
    if args.q_lora_rank:
        query = d * args.q_lora_rank + args.q_lora_rank + args.q_lora_rank * h * args.qk_head_dim
    else:
        query = d * h * args.qk_head_dim
    kv = d * (args.kv_lora_rank + args.qk_rope_head_dim) + args.kv_lora_rank
    kv += args.kv_lora_rank * h * (args.qk_nope_head_dim + args.v_head_dim)
    return query + kv + h * args.v_head_dim * d


def parameter_counts(args: DeepSeekV3Args) -> tuple[int, int]:
    """(total, active per token) parameters, embedding and head included (a tied head counted once), and the
    multi-token-prediction block when there is one (its head is the main one)."""
    if args.vocab_size is None:
        raise ValueError("parameter_counts: DeepSeekV3Args.vocab_size is None; fill it first")
    layers = args.n_layers + args.mtp_layers
    total, active = decoder_parameter_counts(
        vocab_size=args.vocab_size, dim=args.dim, tie_embeddings=args.tie_embeddings,
        attention=attention_parameters(args) + 2 * args.dim,  # + the block's two norms
        sparse=[args.is_sparse(i) for i in range(layers)], dense_hidden=args.intermediate_size,
        num_experts=args.n_routed_experts, experts_per_token=args.num_experts_per_tok,
        expert_hidden=args.moe_intermediate_size, shared_hidden=args.n_shared_experts * args.moe_intermediate_size)
    mtp = args.mtp_layers * (2 * args.dim * args.dim + 3 * args.dim)  # eh_proj, enorm, hnorm, shared_head.norm
    return total + mtp, active + mtp


def flops_per_token(args: DeepSeekV3Args, seq_len: int, *, full_attention: bool = False) -> float:
    """Training FLOPs per token: 6 x active non-embedding parameters (head included) + attention's matmuls;
    with multi-token prediction, its block, its projection and its second pass through the head too."""
    if args.vocab_size is None:
        raise ValueError("flops_per_token: DeepSeekV3Args.vocab_size is None; fill it from the tokenizer first")
    _, active = parameter_counts(args)
    # Per key: q.k over qk_head_dim channels, then the value's v_head_dim; x2 (multiply-add) x3 (fwd + bwd).
    per_key = 6.0 * (args.n_layers + args.mtp_layers) * args.n_heads * (args.qk_head_dim + args.v_head_dim)
    main = decoder_flops_per_token(active, vocab_size=args.vocab_size, dim=args.dim,
                                   tie_embeddings=args.tie_embeddings, seq_len=seq_len,
                                   full_attention=full_attention, attention_per_key=per_key)
    return main + 6.0 * args.mtp_layers * args.vocab_size * args.dim

"""The Llama 3 / 3.1 / 3.2 decoder-only transformer, in one file.

Features:
  * RMSNorm before attention and before the feed-forward (pre-norm), and a final norm;
  * rotary position embeddings over consecutive pairs of each head's channels, with the
    Llama 3.1 frequency scaling for long contexts (``RopeScaling``);
  * grouped-query attention (``n_kv_heads`` <= ``n_heads``), causal, with no mask ever
    materialised: on CPU in float32 with 16/32/64-channel heads through the project's
    fused kernel (``cpu_attention``), elsewhere through
    ``F.scaled_dot_product_attention(is_causal=True)`` (flash kernels), or FlexAttention;
  * packed windows of several documents (``forward(tokens, positions=...)``, the core's
    ``data.document_masking``): attention is block-causal (no token sees another
    document) and RoPE positions restart at each document, in every kernel above;
  * SwiGLU feed-forward with Llama's hidden-size rule;
  * an output head that is its own matrix, or tied to the embedding (``tie_embeddings``,
    as in Llama 3.2 1B/3B; declared through ``tied_weights()`` so the core keeps the tie
    through ``to_empty`` and parallelism); no biases anywhere;
  * an optional key/value cache for sampling (``forward(tokens, cache=...)``, the contract
    of ``titan_core.KVCache``): new tokens only, positions continuing from the cache;
  * a forward that tolerates the pipeline splitter removing ``tok_embeddings``,
    ``norm``, ``output`` or some ``layers`` (a stage then passes hidden states on);
  * context parallelism by the core (``use_context_parallel_attention``: attention through SDPA only);
  * buildable on the meta device; weights are filled per parameter name from a seeded
    generator (``init_parameter``), so the same seed gives the same weights on any
    device and under any sharding.

Nothing here knows about parallelism: tensor-parallel plans shard ``wq``/``wk``/``wv``/
``w1``/``w3`` column-wise and ``wo``/``w2`` row-wise, and attention derives its local
head count from the weights it is given.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from titan_core.models.decoder import DecoderModel
from titan_core.models.model_parts import FeedForward, final_norm_and_head

from . import cpu_attention

try:  # an optional capability of the core (QK-clip, layer statistics): a core without it gets no logits
    from titan_core.models import attention_logits as _logits
except ImportError:  # pragma: no cover - an older titan-core
    _logits = None  # type: ignore[assignment]

if TYPE_CHECKING:  # imported where used: flex_attention is not needed to build or run the other kernels
    from torch.nn.attention.flex_attention import BlockMask

    from titan_core.models.kv_cache import KVCache, LayerCache

ATTENTION_KERNELS = ("auto", "fused", "sdpa", "flex")


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3.1 rotary frequency scaling: long wavelengths are slowed by ``factor``."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class LlamaArgs:
    """Shape of a Llama model. Frozen: derive variants with ``dataclasses.replace``."""

    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: int | None = None  # None: as many key/value heads as query heads
    vocab_size: int | None = None  # None: filled from the tokenizer by the core
    multiple_of: int = 256  # the feed-forward hidden size is rounded up to this
    ffn_dim_multiplier: float | None = None
    # Given directly (as Hugging Face's intermediate_size), it replaces the rule above.
    intermediate_size: int | None = None
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    rope_scaling: RopeScaling | None = None  # None: plain RoPE
    max_seq_len: int = 2048  # length of the rotary table; longer inputs are an error
    # "auto": the fused CPU kernel where it applies (cpu_attention.supports) and is the faster (packed
    # documents, or a CPU with AVX-512: cpu_attention.faster_than_aten), else FlexAttention for packed
    # documents on CUDA, else SDPA; "fused": the fused CPU kernel wherever it applies;
    # "sdpa": F.scaled_dot_product_attention; "flex": FlexAttention for packed documents (CUDA; on CPU
    # torch runs it forward-only); plain causal windows keep the SDPA/fused kernels, as fast there.
    attention_kernel: str = "auto"
    tie_embeddings: bool = False  # True: the output head is the embedding table (one tensor)

    def __post_init__(self) -> None:
        if self.attention_kernel not in ATTENTION_KERNELS:
            raise ValueError(f"LlamaArgs: attention_kernel={self.attention_kernel!r} is not one of {ATTENTION_KERNELS}")
        if self.dim % self.n_heads:
            raise ValueError(f"LlamaArgs: dim={self.dim} is not divisible by n_heads={self.n_heads}")
        if self.head_dim % 2:
            raise ValueError(f"LlamaArgs: head_dim={self.head_dim} must be even for rotary embeddings")
        if self.n_heads % self.kv_heads:
            raise ValueError(f"LlamaArgs: n_heads={self.n_heads} is not divisible by n_kv_heads={self.kv_heads}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def ffn_hidden_dim(self) -> int:
        """``intermediate_size`` if given, else Llama's rule: 2/3 of 4*dim, times the multiplier,
        rounded up to ``multiple_of``."""
        if self.intermediate_size is not None:
            return self.intermediate_size
        hidden = int(2 * (4 * self.dim) / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)


def rope_frequencies(
    head_dim: int, theta: float, scaling: RopeScaling | None, device: torch.device | None = None
) -> torch.Tensor:
    """The rotation speed of each channel pair, ``theta ** (-2i / head_dim)``, optionally 3.1-scaled."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    if scaling is None:
        return freqs
    # Wavelengths shorter than the original context / high_freq_factor are kept, those
    # longer than context / low_freq_factor are slowed by `factor`; in between the two
    # are blended linearly in (context / wavelength).
    wavelen = 2 * math.pi / freqs
    ctx = scaling.original_max_position_embeddings
    smooth = (ctx / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    blended = (1 - smooth) * freqs / scaling.factor + smooth * freqs
    scaled = torch.where(wavelen > ctx / scaling.low_freq_factor, freqs / scaling.factor, blended)
    return torch.where(wavelen < ctx / scaling.high_freq_factor, freqs, scaled)


def rope_table(args: LlamaArgs, device: torch.device | None = None) -> torch.Tensor:
    """``exp(i * pos * freq)`` for every position below ``max_seq_len``: complex64 [max_seq_len, head_dim/2]."""
    # On meta (how the trainer builds every model) only the shape exists: computing the table there would
    # run torch's Python reference kernels, whose first use imports torch._dynamo (about 1 s of CPU on every
    # rank). init_buffers() computes it on the real device.
    if torch.empty(0, device=device).is_meta:
        return torch.empty(args.max_seq_len, len(range(0, args.head_dim, 2)), dtype=torch.complex64, device=device)
    freqs = rope_frequencies(args.head_dim, args.rope_theta, args.rope_scaling, device)
    positions = torch.arange(args.max_seq_len, device=device, dtype=torch.float32)
    angles = torch.outer(positions, freqs)
    return torch.polar(torch.ones_like(angles), angles)


def apply_rope(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x[..., 2i], x[..., 2i+1]) of ``x`` [b, s, heads, head_dim] by pos * freq_i.

    ``freqs_cis`` is the table (row = position, [max_seq_len, head_dim/2]), or with packed
    documents each token's own row already gathered ([b, s, head_dim/2]).

    Viewing the pairs as complex numbers makes the rotation one complex multiply, which
    measured faster on CPU (forward and backward) than real cos/sin tables.
    """
    seqlen = x.shape[1]
    if not freqs_cis.is_complex():
        # model.to(dtype) casts the complex table to a real one, dropping the sines.
        raise ValueError(
            f"the rotary table is {freqs_cis.dtype}, not complex: cast only the parameters, or call init_buffers()"
        )
    xc = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))
    if freqs_cis.dim() == 3:  # per token, gathered at its position in its document
        return torch.view_as_real(xc * freqs_cis[:, :, None, :]).flatten(-2).type_as(x)
    if seqlen > freqs_cis.shape[0]:
        raise ValueError(f"sequence length {seqlen} exceeds the rotary table's max_seq_len {freqs_cis.shape[0]}")
    rotated = torch.view_as_real(xc * freqs_cis[:seqlen, None, :]).flatten(-2)
    return rotated.type_as(x)


class _RMSNormFunction(torch.autograd.Function):
    """RMSNorm with a hand-written backward that saves only x and 1/rms.

    On CPU ``F.rms_norm`` is a composite whose autograd graph keeps and re-reads several
    full-size intermediates; this measured ~30% faster there (fwd+bwd, fp32). CUDA has a
    fused kernel, so other devices keep ``F.rms_norm``.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        rstd = (x * x).mean(-1, keepdim=True).add_(eps).rsqrt_()
        ctx.save_for_backward(x, weight, rstd)
        return (x * rstd).mul_(weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, weight, rstd = ctx.saved_tensors
        x_hat = x * rstd
        grad_weight = (grad * x_hat).sum(tuple(range(grad.dim() - 1)))
        grad_x_hat = grad * weight
        # d/dx of x*rstd: project out the component along x_hat, then rescale.
        dot = (grad_x_hat * x_hat).mean(-1, keepdim=True)
        return grad_x_hat.sub_(x_hat.mul_(dot)).mul_(rstd), grad_weight, None


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, over the last dimension."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Plain tensors only: sharded (DTensor) inputs keep torch's well-trodden path.
        plain = type(x) is torch.Tensor and type(self.weight) in (torch.Tensor, nn.Parameter)
        if plain and x.device.type == "cpu" and x.dtype == torch.float32:
            return _RMSNormFunction.apply(x, self.weight, self.eps)
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


class Attention(nn.Module):
    """Causal grouped-query self-attention with rotary embeddings."""

    def __init__(self, args: LlamaArgs) -> None:
        super().__init__()
        self.head_dim = args.head_dim
        self.kernel = args.attention_kernel
        # Decided here, not in forward: torch.compile would trace the CPU-flag read instead of taking its value.
        self.fused_for_causal = self.kernel == "fused" or (self.kernel == "auto" and cpu_attention.faster_than_aten())
        self.wq = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.kv_heads * args.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.kv_heads * args.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)

    def use_fused_kernel(self, starts: torch.Tensor | None) -> bool:
        """Whether to try the fused CPU kernel: asked for, or ``auto`` where it is the faster. With packed
        documents it stays: SDPA would need a dense [s, s] mask and a slower kernel that takes one."""
        if starts is not None and self.kernel == "auto":
            return True
        return self.fused_for_causal

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor, *, starts: torch.Tensor | None = None,
                block_mask: BlockMask | None = None, cache: LayerCache | None = None) -> torch.Tensor:
        """``starts`` [b, s]: each token's document start (None: one sequence, causal);
        ``block_mask``: the same mask built for FlexAttention, which then runs;
        ``cache`` (sampling only): this layer's keys and values of the earlier positions."""
        bs, seqlen, _ = x.shape
        # Head counts come from the (possibly tensor-parallel sharded) weights, not args.
        q = self.wq(x).view(bs, seqlen, -1, self.head_dim)
        k = self.wk(x).view(bs, seqlen, -1, self.head_dim)
        v = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        q, k = apply_rope(q, freqs_cis), apply_rope(k, freqs_cis)
        if cache is not None:
            return self._cached(q, k, v, cache)
        if _logits is not None and _logits.attention_logits_requested():  # asked by the core: nothing otherwise
            _logits.record_attention_logits(self, q, k, q_proj=self.wq, k_proj=self.wk, starts=starts)
        if block_mask is None and self.use_fused_kernel(starts) and cpu_attention.supports(q, k, v):
            # Takes and returns the [b, s, h, d] layout, so no transposes at all.
            out, _ = cpu_attention.causal_attention(q, k, v, starts)
            return self.wo(out.flatten(2))
        # Measured on CPU: the flash kernel runs ~10% faster (fwd+bwd) on contiguous
        # [b, h, s, d] inputs than on transposed views, more than paying for the copies.
        q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        gqa = k.shape[1] != q.shape[1]
        if block_mask is not None:
            out = _flex_attention(q.device)(q, k, v, block_mask=block_mask, enable_gqa=gqa)
        elif starts is not None:
            # A dense [b, 1, s, s] mask: SDPA then uses a kernel that takes one (not flash).
            index = torch.arange(seqlen, device=x.device)
            visible = (index[None, :] <= index[:, None]) & (index[None, None, :] >= starts[:, :, None])
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible[:, None], enable_gqa=gqa)
        else:
            # With fewer kv heads, enable_gqa lets the kernel share them (the CPU flash kernel
            # supports it and is as fast as repeating them, without the copies).
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        # The kernel's output is laid out [b, s, h, d], so this reshape is a view.
        return self.wo(out.transpose(1, 2).reshape(bs, seqlen, -1))

    def _cached(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: LayerCache) -> torch.Tensor:
        """Sampling: the new queries attend to every cached key and to the new keys up to their own."""
        bs, seqlen = q.shape[:2]
        k, v = cache.append(k, v)
        past = k.shape[1] - seqlen
        # SDPA's is_causal aligns the mask to the top left, right only without a past; one new
        # query sees every key; several new queries after a past need the mask shifted by it.
        mask = None
        if past and seqlen > 1:
            mask = torch.ones(seqlen, k.shape[1], dtype=torch.bool, device=q.device).tril(diagonal=past)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=not past and seqlen > 1,
                                             enable_gqa=k.shape[1] != q.shape[1])
        return self.wo(out.transpose(1, 2).reshape(bs, seqlen, -1))


class TransformerBlock(nn.Module):
    """Pre-norm residual block: x + attention(norm(x)), then h + feed_forward(norm(h))."""

    def __init__(self, args: LlamaArgs) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args.dim, args.ffn_hidden_dim)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor, *, starts: torch.Tensor | None = None,
                block_mask: BlockMask | None = None, cache: LayerCache | None = None) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), freqs_cis, starts=starts, block_mask=block_mask, cache=cache)
        return h + self.feed_forward(self.ffn_norm(h))


def _flex_attention(device: torch.device) -> Callable[..., torch.Tensor]:
    """FlexAttention, compiled on CUDA (eager, it computes the whole score matrix; torch runs it
    forward-only on CPU, where it serves to check the other kernels)."""
    from torch.nn.attention.flex_attention import flex_attention

    return _compiled(flex_attention) if device.type == "cuda" else cast(Callable[..., torch.Tensor], flex_attention)


@functools.cache
def _compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    return torch.compile(fn, dynamic=False)


def _document_block_mask(starts: torch.Tensor) -> BlockMask:
    """FlexAttention's block-causal mask: a key is hidden when it is after the query or before
    the start of the query's document. Compiled on CUDA: eager, it materialises [b, s, s]."""
    from torch.nn.attention.flex_attention import create_block_mask

    def visible(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return (kv <= q) & (kv >= starts[b, q])

    batch, seqlen = starts.shape
    build = _compiled(create_block_mask) if starts.device.type == "cuda" else create_block_mask
    return build(visible, batch, None, seqlen, seqlen, device=starts.device)


class Transformer(DecoderModel):
    """Token ids [b, s] -> logits [b, s, vocab]; a pipeline stage may lack either end."""

    freqs_cis: torch.Tensor  # the rotary table, a non-persistent buffer

    def __init__(self, args: LlamaArgs) -> None:
        super().__init__(args, lambda i: TransformerBlock(args), RMSNorm(args.dim, args.norm_eps))
        # Non-persistent: derived from args, so not saved; recomputed by init_buffers().
        self.register_buffer("freqs_cis", rope_table(args), persistent=False)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None, *,
                cache: KVCache | None = None) -> torch.Tensor:
        """``positions`` (int [b, s], optional): each token's position in its document, 0 at every
        document's first token. Given, a row holds several documents back to back: none attends
        to another, and RoPE uses these positions. None: one sequence per row, plain causal.
        ``cache`` (sampling only, one sequence per row): ``tokens`` are the new tokens, at positions
        from ``cache.offset``."""
        # Without tok_embeddings this is a later pipeline stage: the input is hidden states.
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        freqs_cis, starts, block_mask = self.freqs_cis, None, None
        if cache is not None:
            if positions is not None:
                raise ValueError("a KV cache samples one sequence per row: pass positions or cache, not both")
            end = cache.offset + h.shape[1]
            if end > freqs_cis.shape[0]:
                raise ValueError(f"position {end} exceeds the rotary table's max_seq_len {freqs_cis.shape[0]}")
            freqs_cis = freqs_cis[cache.offset:end]
        if positions is not None:
            if positions.dim() != 2 or positions.shape[0] != tokens.shape[0]:
                raise ValueError(f"positions {tuple(positions.shape)} are not [batch, seq] for tokens {tuple(tokens.shape)}")
            freqs_cis = self.freqs_cis[positions]  # an out-of-table position is an IndexError here
            starts = cpu_attention.document_starts(positions)
            # FlexAttention on request, and by default on CUDA, where SDPA would take a dense mask.
            if self.args.attention_kernel == "flex" or (self.args.attention_kernel == "auto" and h.device.type == "cuda"):
                block_mask = _document_block_mask(starts)  # built once, for every layer
        for name, layer in self.layers.items():
            h = layer(h, freqs_cis, starts=starts, block_mask=block_mask,
                      cache=None if cache is None else cache.layer(name))
        return final_norm_and_head(h, self.norm, self.output)

    # tied_weights, init_parameter (the untied embedding at unit scale), init_weights: DecoderModel's.

    def use_context_parallel_attention(self) -> None:
        """Declares context-parallelism support (the core's ``parallelism.cp``): from now on every attention
        goes through ``F.scaled_dot_product_attention`` (causal, or with the block-causal mask of
        ``positions``), which the core then computes across the ranks that hold parts of the sequence."""
        self.args = dataclasses.replace(self.args, attention_kernel="sdpa")
        for module in self.modules():
            if isinstance(module, Attention):
                module.kernel, module.fused_for_causal = "sdpa", False

    def init_buffers(self) -> None:
        """Recompute the rotary table on the buffer's current device (after ``to_empty``)."""
        self.freqs_cis = rope_table(self.args, self.freqs_cis.device)



def flops_per_token(args: LlamaArgs, seq_len: int, *, full_attention: bool = False) -> float:
    """Training FLOPs per token: 6 x non-embedding parameters + attention's score and value matmuls.

    The attention term is 12 x layers x heads x head_dim x the keys each query attends to
    (forward and backward). The causal kernel computes only the unmasked pairs, on average
    (seq_len + 1) / 2 keys per query; ``full_attention=True`` counts the full seq_len square
    instead, the custom of published MFU figures, which overstates the work about twice.
    """
    if args.vocab_size is None:
        raise ValueError("flops_per_token: LlamaArgs.vocab_size is None; fill it from the tokenizer first")
    d, hd, kv = args.dim, args.head_dim, args.kv_heads
    attention = d * (args.n_heads * hd) * 2 + d * (kv * hd) * 2
    per_layer = attention + 3 * d * args.ffn_hidden_dim + 2 * d
    non_embedding = args.n_layers * per_layer + d + d * args.vocab_size  # the head's matmul, tied or not
    keys_per_query = seq_len if full_attention else (seq_len + 1) / 2
    return 6.0 * non_embedding + 12.0 * args.n_layers * args.n_heads * hd * keys_per_query

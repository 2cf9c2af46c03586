"""An optional model capability: each attention head's largest logit, for ``[stability] qk_clip_threshold``
and ``metrics.layer_stats``.

The core asks by running a forward inside :func:`attention_logits`; a model's attention that supports it
calls :func:`record_attention_logits` with its queries and keys after RoPE (a no-op outside a request, so
a model that never calls it simply offers nothing: the capability is opt-in by use, like
``hidden_states_for_loss``). Per head, the maximum of ``q . k * scale`` over the positions each query
sees (causal; within its document with ``starts``), over the whole batch.

A request may ``adjust``: given a module's measurement it returns per-head factors for the queries and
the keys, which the call applies to ``q`` and ``k`` in place, so the rest of that forward (the later
layers) runs as a model whose projections carry those factors would (QK-clip). The attention must use
``q`` and ``k`` as the call left them.

Multi-head latent attention (DeepSeek-V3) passes ``decoupled=DecoupledRope(...)``: each head's channels are
a position-free part and a rotary part, and the rotary key is one for every head. A head's factor gamma
then goes as Kimi K2's MuonClip takes it: sqrt(gamma) on the query's and the key's position-free parts,
gamma on the query's rotary part, the shared rotary key untouched, so every logit of the head is
multiplied by gamma and no other head's changes.

Attention with QK-norm (Qwen3) passes ``norms=(q_norm, k_norm)``: the norms undo any scaling of the
projections, and their weights are one per channel, shared by every head, so no head can be scaled alone.
QK-clip then scales both norm weights by sqrt of the worst head's factor (every head of the layer by it,
which keeps each under the threshold), and its ``adjust`` returns that factor for every head.

A plugin that uses it imports it guarded (``try: from titan_core.models.attention_logits import ...``),
so it still runs on a core without it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["AttentionLogits", "DecoupledRope", "HeadLogits", "attention_logits", "attention_logits_requested",
           "record_attention_logits"]

# Score elements computed at once (queries are taken in chunks): bounds the memory of the measurement.
CHUNK_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class DecoupledRope:
    """How an MLA head's rows lie: ``q_proj`` holds per head ``nope`` position-free rows then ``rope`` rotary
    rows; ``k_proj`` (the key/value up-projection) holds per head ``nope`` key rows then ``value`` value rows;
    the rotary key comes from elsewhere, shared by every head, and is never scaled."""

    nope: int
    rope: int
    value: int

    def query_rows(self, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        """Row factors of ``q_proj`` for per-head factors ``query`` and ``key`` (the rotary rows carry both)."""
        return torch.cat([query[:, None].expand(-1, self.nope), (query * key)[:, None].expand(-1, self.rope)],
                         dim=1).flatten()

    def key_rows(self, key: torch.Tensor) -> torch.Tensor:
        """Row factors of ``k_proj``: the position-free key rows carry ``key``; the value rows stay."""
        return torch.cat([key[:, None].expand(-1, self.nope), torch.ones_like(key)[:, None].expand(-1, self.value)],
                         dim=1).flatten()


@dataclass
class HeadLogits:
    """One attention module's measurement: its projections and each of its (local) query heads' maximum."""

    module: nn.Module
    q_proj: nn.Linear
    k_proj: nn.Linear
    head_dim: int
    kv_heads: int
    max: torch.Tensor  # float32 [query heads], -inf where a head saw nothing
    factors: tuple[torch.Tensor, torch.Tensor] | None = None  # (query [hq], key [hkv]) an adjust applied
    decoupled: DecoupledRope | None = None  # an MLA head's layout (None: rows head after head, all scaled)
    norms: tuple[nn.Module, nn.Module] | None = None  # QK-norm shared by every head: (q_norm, k_norm)

    def query_rows(self, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        """The factor of each output row of ``q_proj``, from the per-head factors."""
        if self.decoupled is not None:
            return self.decoupled.query_rows(query, key)
        return query.repeat_interleave(self.head_dim)

    def key_rows(self, key: torch.Tensor) -> torch.Tensor:
        """The factor of each output row of ``k_proj``, from the per-key-head factors."""
        if self.decoupled is not None:
            return self.decoupled.key_rows(key)
        return key.repeat_interleave(self.head_dim)


Adjust = Callable[[HeadLogits], "tuple[torch.Tensor, torch.Tensor] | None"]


class AttentionLogits:
    """What a request gathered: each attention module that recorded, by ``id``."""

    def __init__(self, adjust: Adjust | None = None) -> None:
        self.heads: dict[int, HeadLogits] = {}
        self.adjust = adjust


class _Current:
    """The request in force, if any. A plain attribute, not a ``ContextVar``: the model's forward asks on
    every call, and torch.compile traces an attribute read (guarding on its value) but not
    ``ContextVar.get``, which broke compiled, checkpointed blocks. Forwards run on the training thread."""

    request: AttentionLogits | None = None


_CURRENT = _Current()


@contextlib.contextmanager
def attention_logits(adjust: Adjust | None = None) -> Iterator[AttentionLogits]:
    """Within this block, attention that calls :func:`record_attention_logits` records its heads' maxima
    (and, with ``adjust``, scales its queries and keys by the factors ``adjust`` returns)."""
    request = AttentionLogits(adjust)
    before, _CURRENT.request = _CURRENT.request, request
    try:
        yield request
    finally:
        _CURRENT.request = before


def attention_logits_requested() -> bool:
    return _CURRENT.request is not None


@torch.no_grad()
def _head_max(q: torch.Tensor, k: torch.Tensor, scale: float, starts: torch.Tensor | None) -> torch.Tensor:
    """[query heads]: max of q.k*scale over visible (query, key) pairs; q [b, s, hq, d], k [b, s, hkv, d]."""
    bs, seqlen, hq, _ = q.shape
    group = hq // k.shape[2]
    q, k = q.float().transpose(1, 2), k.float().repeat_interleave(group, dim=2).transpose(1, 2)  # [b, h, s, d]
    keys = torch.arange(seqlen, device=q.device)
    chunk = max(1, CHUNK_ELEMENTS // max(1, bs * hq * seqlen))
    best = torch.full((hq,), -math.inf, dtype=torch.float32, device=q.device)
    for first in range(0, seqlen, chunk):
        rows = torch.arange(first, min(first + chunk, seqlen), device=q.device)
        scores = torch.matmul(q[:, :, rows], k.transpose(-1, -2)) * scale  # [b, h, c, s]
        hidden = keys[None, :] > rows[:, None]  # [c, s]: the future
        if starts is not None:  # [b, c, s]: before the query's document too
            hidden = hidden[None] | (keys[None, None, :] < starts[:, rows][:, :, None])
            hidden = hidden[:, None]
        scores = scores.masked_fill(hidden, -math.inf)
        best = torch.maximum(best, scores.amax(dim=(0, 2, 3)))
    return best


def record_attention_logits(module: nn.Module, q: torch.Tensor, k: torch.Tensor, *, q_proj: nn.Linear,
                            k_proj: nn.Linear, scale: float | None = None, starts: torch.Tensor | None = None,
                            decoupled: DecoupledRope | None = None,
                            norms: tuple[nn.Module, nn.Module] | None = None) -> None:
    """Called by a model's attention with its queries ``q`` [b, s, heads, head_dim] and keys ``k``
    [b, s, kv_heads, head_dim] after RoPE, and the projections that made them (their output rows are
    head after head); ``scale`` defaults to head_dim^-0.5; ``starts`` [b, s]: each token's document start;
    ``decoupled``: an MLA layout (``k`` then holds each head's position-free key and the shared rotary key,
    ``nope + rope`` channels, as ``q`` does); ``norms``: the QK-norms (q_norm, k_norm) whose weights every head
    shares. Outside :func:`attention_logits` it does nothing. Several calls (micro-batches) keep the maximum."""
    request = _CURRENT.request
    if request is None:
        return
    head_dim = q.shape[-1]
    found = _head_max(q.detach(), k.detach(), head_dim**-0.5 if scale is None else scale, starts)
    seen = request.heads.get(id(module))
    if seen is None:
        seen = request.heads[id(module)] = HeadLogits(module, q_proj, k_proj, head_dim, k.shape[2], found,
                                                      decoupled=decoupled, norms=norms)
    else:
        seen.max = torch.maximum(seen.max, found)
    if request.adjust is not None:
        seen.factors = request.adjust(seen)
        if seen.factors is not None:
            query, key = (f.to(q.dtype)[:, None] for f in seen.factors)
            with torch.no_grad():
                if decoupled is None:
                    q.mul_(query)
                    k.mul_(key)
                else:  # position-free parts by their own factors, the query's rotary part by both
                    q[..., :decoupled.nope].mul_(query)
                    q[..., decoupled.nope:].mul_(query * key)
                    k[..., :decoupled.nope].mul_(key)

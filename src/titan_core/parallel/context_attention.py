"""Causal attention over a sequence split across context-parallel ranks, exact to one process.

Each rank holds the queries, keys and values of its own chunks (``context_layout``). Keys and
values are all-gathered over the cp ranks (one collective for each, rather than ``cp - 1``
ring passes): with grouped-query attention they are a fraction of the queries' size, gloo and
NCCL both do it in one call, and every rank then computes its query chunks against the key
chunks they can see, block by block. A block wholly in the future (or, with documents, wholly
before every query's document) is skipped, so the work is the causal triangle only; with the
load-balanced layout every rank does the same amount.

Each block gives a partial output and the log-sum-exp of its scores; the partial results are
merged exactly: ``lse = logaddexp(lse_a, lse_b)``, ``out = out_a e^(lse_a - lse) + out_b
e^(lse_b - lse)``. Backward recomputes each block's probabilities from the final
log-sum-exp (as flash attention does), so no block's scores are kept between forward and
backward: only the local q, k, v, the output and its log-sum-exp. The gathered keys and values
are gathered again in backward rather than saved (they are ``cp`` times the local ones), and
their gradients are summed onto the ranks that own them with one reduce-scatter.

The math is plain matmuls and softmax in float32, so it runs on any device and dtype
(bfloat16 inputs are multiplied in bfloat16, their scores and the merge in float32; float64
stays float64).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from .context_layout import ContextLayout


@dataclass
class AttentionWork:
    """Query-key pairs computed per call (one sequence, one head): for the balance benchmark."""

    pairs: list[float] = field(default_factory=list)


def _gather(t: torch.Tensor, layout: ContextLayout, group: dist.ProcessGroup | None) -> list[torch.Tensor]:
    """The whole sequence of ``t`` [b, h, local, d] as one tensor per global chunk, in order."""
    parts = [t]
    if group is not None:
        out = t.new_empty((layout.cp * t.shape[0], *t.shape[1:]))
        _all_gather(out, t.contiguous(), group)
        parts = list(out.view(layout.cp, *t.shape).unbind(0))
    n = layout.chunk_len
    by_chunk: dict[int, torch.Tensor] = {}
    for rank, part in enumerate(parts):
        for i, chunk in enumerate(layout.chunks_of(rank)):
            by_chunk[chunk] = part.narrow(2, i * n, n)
    return [by_chunk[c] for c in range(layout.chunk_count)]


def _scatter_to_owners(chunks: list[torch.Tensor], layout: ContextLayout,
                       group: dist.ProcessGroup | None) -> torch.Tensor:
    """Per-chunk gradients [b, h, n, d] of the whole sequence -> this rank's, summed over the cp ranks."""
    rank_major = torch.stack([torch.cat([chunks[c] for c in layout.chunks_of(r)], dim=2) for r in range(layout.cp)])
    if group is None:
        return rank_major[layout.rank]
    out = rank_major.new_empty(rank_major.shape[1:])
    _reduce_scatter(out, rank_major.flatten(0, 1).contiguous(), group)
    return out


def _all_gather(out: torch.Tensor, t: torch.Tensor, group: dist.ProcessGroup) -> None:
    """Rank-major concatenation along dim 0 (torch 2.13 renamed the call ``all_gather_single``)."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, t, group=group)


def _reduce_scatter(out: torch.Tensor, t: torch.Tensor, group: dist.ProcessGroup) -> None:
    """The sum over ranks of this rank's dim-0 slice (``reduce_scatter_single`` from torch 2.13)."""
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    scatter(out, t, op=dist.ReduceOp.SUM, group=group)


def _block_mask(layout: ContextLayout, q_chunk: int, k_chunk: int, starts: torch.Tensor | None,
                device: torch.device) -> torch.Tensor | None | bool:
    """Visible pairs of (query chunk, key chunk): None = all, False = none (skip the block),
    else bool [b or 1, 1, 1, n, n]. ``starts`` [b, n]: the global start of each query's document."""
    n = layout.chunk_len
    if k_chunk > q_chunk:
        return False
    keys = torch.arange(k_chunk * n, (k_chunk + 1) * n, device=device)
    mask: torch.Tensor | None = None
    if k_chunk == q_chunk:
        queries = torch.arange(q_chunk * n, (q_chunk + 1) * n, device=device)
        mask = (keys[None, :] <= queries[:, None])[None]
    if starts is not None:
        if int(starts.min()) > k_chunk * n + n - 1:  # every key is before every query's document
            return False
        in_document = keys[None, None, :] >= starts[:, :, None]
        mask = in_document if mask is None else mask & in_document
    return None if mask is None else mask[:, None, None]


def _acc(t: torch.Tensor) -> torch.dtype:
    """The dtype scores and merges run in: float32, or the input's when wider (float64 checks)."""
    return torch.promote_types(t.dtype, torch.float32)


def _scores(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """Scores [b, hkv, g, nq, nk] of grouped queries q [b, hkv, g, nq, d] and keys [b, hkv, nk, d]."""
    s = torch.matmul(q, k.unsqueeze(2).transpose(-1, -2)).to(_acc(q)).mul_(scale)
    return s if mask is None else s.masked_fill_(~mask, float("-inf"))


def _visible_blocks(layout: ContextLayout, starts: torch.Tensor | None,
                    device: torch.device) -> list[tuple[int, int, torch.Tensor | None]]:
    """(local query chunk, global key chunk, mask) of every block with a visible pair."""
    n = layout.chunk_len
    blocks = []
    for i, q_chunk in enumerate(layout.local_chunks):
        q_starts = None if starts is None else starts[:, i * n:(i + 1) * n]
        for k_chunk in range(q_chunk + 1):
            mask = _block_mask(layout, q_chunk, k_chunk, q_starts, device)
            if mask is not False:
                blocks.append((i, k_chunk, mask if isinstance(mask, torch.Tensor) else None))
    return blocks


def _pairs(layout: ContextLayout, blocks: list[tuple[int, int, torch.Tensor | None]]) -> float:
    """Query-key pairs of one sequence and head in ``blocks`` (a diagonal block: its lower triangle)."""
    n = layout.chunk_len
    return sum(n * (n + 1) / 2 if layout.local_chunks[i] == k_chunk else n * n for i, k_chunk, _ in blocks)


def attention_pairs(layout: ContextLayout, starts: torch.Tensor | None = None) -> float:
    """The query-key pairs this rank computes per sequence and head: the work the load balance evens out."""
    return _pairs(layout, _visible_blocks(layout, starts, torch.device("cpu")))


#: Scores held at once (per tile of query rows): the block's transients (scores, probabilities, their gradient)
#: stay a few of these, however long the chunks (a 4096 x 4096 block of 16 heads would be 1 GiB each).
TILE_SCORES = 2**24


def _tiles(blocks: list[tuple[int, int, torch.Tensor | None]], n: int, scores_per_row: int,
           ) -> list[tuple[slice, int, torch.Tensor | None]]:
    """Each visible block cut into tiles of query rows: (local rows, key chunk, the tile's mask)."""
    step = max(1, min(n, TILE_SCORES // max(scores_per_row, 1)))
    return [(slice(i * n + a, i * n + min(a + step, n)), k_chunk, None if mask is None else mask[..., a:a + step, :])
            for i, k_chunk, mask in blocks for a in range(0, n, step)]


def _forward(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], layout: ContextLayout,
             blocks: list[tuple[int, int, torch.Tensor | None]], scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(output [b, hkv, g, local, d] float32, log-sum-exp [b, hkv, g, local] float32) over the visible blocks."""
    n = layout.chunk_len
    out = q.new_zeros(q.shape, dtype=_acc(q))
    lse = q.new_full(q.shape[:-1], float("-inf"), dtype=_acc(q))
    for rows, k_chunk, mask in _tiles(blocks, n, q.shape[0] * q.shape[1] * q.shape[2] * n):
        s = _scores(q[..., rows, :], keys[k_chunk], mask, scale)
        block_lse = torch.logsumexp(s, dim=-1)
        finite = torch.isfinite(block_lse)
        p = torch.exp(s - torch.where(finite, block_lse, 0.0).unsqueeze(-1))
        block_out = torch.matmul(p.to(values[k_chunk].dtype), values[k_chunk].unsqueeze(2)).to(out.dtype)
        merged = torch.logaddexp(lse[..., rows], block_lse)
        seen = torch.isfinite(merged)
        keep = torch.where(seen, torch.exp(lse[..., rows] - merged), 0.0)
        take = torch.where(seen, torch.exp(block_lse - merged), 0.0)
        out[..., rows, :] = out[..., rows, :] * keep.unsqueeze(-1) + block_out * take.unsqueeze(-1)
        lse[..., rows] = merged
    return out, lse


class _ContextAttention(torch.autograd.Function):
    """q [b, hq, local, d], k/v [b, hkv, local, d] -> out [b, hq, local, d] over the whole sequence."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: ContextLayout,
                starts: torch.Tensor | None, scale: float, group: dist.ProcessGroup | None,
                work: AttentionWork | None) -> torch.Tensor:
        b, hq, local, d = q.shape
        hkv = k.shape[1]
        qg = q.reshape(b, hkv, hq // hkv, local, d)
        blocks = _visible_blocks(layout, starts, q.device)
        if work is not None:
            work.pairs.append(_pairs(layout, blocks))
        out, lse = _forward(qg, _gather(k, layout, group), _gather(v, layout, group), layout, blocks, scale)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.layout, ctx.starts, ctx.scale, ctx.group = layout, starts, scale, group
        return out.reshape(b, hq, local, d)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        layout: ContextLayout = ctx.layout
        b, hq, local, d = q.shape
        hkv, n = k.shape[1], layout.chunk_len
        qg = q.reshape(b, hkv, hq // hkv, local, d)
        dout = grad_out.reshape(qg.shape)
        keys, values = _gather(k, layout, ctx.group), _gather(v, layout, ctx.group)
        # D_i = sum_j P_ij dP_ij = dO_i . O_i: the softmax's backward term, one per query.
        acc = _acc(q)
        delta = (dout.to(acc) * out.to(acc)).sum(-1)
        dq = torch.zeros(qg.shape, dtype=acc, device=q.device)
        dk = [torch.zeros(c.shape, dtype=acc, device=q.device) for c in keys]
        dv = [torch.zeros(c.shape, dtype=acc, device=q.device) for c in values]
        blocks = _visible_blocks(layout, ctx.starts, q.device)
        for rows, k_chunk, mask in _tiles(blocks, n, b * hq * n):
            q_rows, do_rows = qg[..., rows, :], dout[..., rows, :]
            s = _scores(q_rows, keys[k_chunk], mask, ctx.scale)
            p = torch.exp(s - lse[..., rows].unsqueeze(-1))  # masked pairs: exp(-inf) = 0
            dv[k_chunk] += torch.matmul(p.transpose(-1, -2), do_rows.to(acc)).sum(2)
            dp = torch.matmul(do_rows, values[k_chunk].unsqueeze(2).transpose(-1, -2)).to(acc)
            ds = p.mul_(dp.sub_(delta[..., rows].unsqueeze(-1))).mul_(ctx.scale)
            dq[..., rows, :] += torch.matmul(ds, keys[k_chunk].to(acc).unsqueeze(2))
            dk[k_chunk] += torch.matmul(ds.transpose(-1, -2), q_rows.to(acc)).sum(2)
        grad_k = _scatter_to_owners(dk, layout, ctx.group).to(k.dtype)
        grad_v = _scatter_to_owners(dv, layout, ctx.group).to(v.dtype)
        return dq.to(q.dtype).reshape(q.shape), grad_k, grad_v, None, None, None, None, None


def context_parallel_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, layout: ContextLayout,
                               starts: torch.Tensor | None = None, scale: float | None = None,
                               group: dist.ProcessGroup | None = None,
                               work: AttentionWork | None = None) -> torch.Tensor:
    """Causal (block-causal with ``starts``) attention of this rank's queries over every rank's keys.

    ``q`` [b, hq, local, d], ``k``/``v`` [b, hkv, local, d] with hkv dividing hq (grouped-query);
    ``starts`` int64 [b, local]: the global index of each local query's document start (None: one
    document per row); ``group``: the cp ranks (None: ``layout.cp`` is 1 and this process holds every chunk).
    """
    if q.shape[2] != layout.local_len or k.shape[2] != layout.local_len:
        raise ValueError(
            f"context parallelism: attention over {q.shape[2]} queries and {k.shape[2]} keys, but this rank holds "
            f"{layout.local_len} tokens of each sequence; under parallelism.cp every attention must be the model's "
            f"self-attention over the whole (local) sequence"
        )
    if q.shape[1] % k.shape[1] or k.shape[1] != v.shape[1]:
        raise ValueError(f"context parallelism: {q.shape[1]} query heads over {k.shape[1]} key and "
                         f"{v.shape[1]} value heads")
    if group is None and layout.cp != 1:
        raise ValueError(f"context parallelism: cp={layout.cp} needs the cp ranks' process group")
    chosen = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    out: torch.Tensor = _ContextAttention.apply(q, k, v, layout, starts, chosen, group, work)  # type: ignore[no-untyped-call]
    return out

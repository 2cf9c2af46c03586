"""``[stability] qk_clip_threshold`` (tau): after each optimizer step, no attention head's logit on the step's
batch exceeds tau.

After the update, the step's last micro-batch runs forward once more (no gradient) inside the model's
optional ``attention_logits`` request (models/attention_logits.py): each query head's largest
``q . k * scale``, the maximum over every data-parallel rank, layer after layer. A head whose maximum m
exceeds tau has its query and key rows scaled so that every logit of that head is multiplied by tau / m,
and that forward goes on with the layer's queries and keys scaled alike, so each later layer is measured
on what the clipped earlier layers give (a layer's clip changes the next layer's input). The factors:
sqrt(tau / m) each when every query head has its own key head; with grouped keys the key head takes
sqrt of its group's smallest factor and each query head the rest. The logit a head had at m is then
tau: after the step, the batch's maximum is min(m, tau) per head, which is what is logged. With QK-norm
(weights shared by every head, models/attention_logits.py) the layer's worst factor applies to all its heads,
sqrt of it on each norm weight: the worst head ends at tau, the others below min(m, tau).

Under FSDP2 a projection's rows live in shards: each rank scales the rows of its own shard (the
factors are laid out like the weight, no communication). Under tensor parallelism each tp rank measures
its own heads (the column-wise projections split them, and tp divides the key heads, so a query head's
key group is on its rank): the factors it applies in the forward are its own, and the factors for the
weights, like the logged figures, are gathered over tp in head order first. Pipeline parallelism is
refused (config/job.py). The extra forward costs about a third of a step.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Replicate

from ..errors import ConfigError
from ..models.attention_logits import Adjust, AttentionLogits, HeadLogits

PREFIX = "qk_clip/"


def head_factors(maxima: torch.Tensor, kv_heads: int, threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(query-head factors [hq], key-head factors [hkv]) whose products are min(1, tau / max) per query head."""
    logit = torch.where(maxima > threshold, threshold / maxima, torch.ones_like(maxima))
    group = maxima.numel() // kv_heads
    smallest = logit.view(kv_heads, group).amin(dim=1)  # per key head
    key = smallest.sqrt()
    query = logit / key.repeat_interleave(group)
    return query, key


@torch.no_grad()
def scale_rows(weight: torch.Tensor, row_factor: torch.Tensor) -> None:
    """Multiply each output row i of ``weight`` by ``row_factor[i]`` in place; a DTensor scales its own rows."""
    factor = row_factor.to(dtype=weight.dtype)[:, None]
    if isinstance(weight, DTensor):
        mesh = weight.device_mesh
        whole = DTensor.from_local(factor.to(weight.to_local().device), mesh, [Replicate()] * mesh.ndim,
                                   run_check=False)
        weight.to_local().mul_(whole.redistribute(mesh, weight.placements).to_local())
    else:
        weight.mul_(factor.to(weight.device))


@torch.no_grad()
def scale_all(weight: torch.Tensor, factor: torch.Tensor) -> None:
    """Multiply every element of ``weight`` by ``factor`` in place (a DTensor's own shard or replica)."""
    local = weight.to_local() if isinstance(weight, DTensor) else weight
    local.mul_(factor.to(device=local.device, dtype=local.dtype))


def reshard(model_parts: list[nn.Module]) -> None:
    """Free every FSDP2 module's gathered parameters (a no-op without FSDP2)."""
    from torch.distributed.fsdp import FSDPModule

    for part in model_parts:
        for module in part.modules():
            if isinstance(module, FSDPModule):
                module.reshard()


class QKClip:
    """Measures after each step and rescales the heads above the threshold; the figures go to logging steps."""

    def __init__(self, threshold: float, *, model_parts: list[nn.Module], layer_of: Callable[[nn.Module], str | None],
                 dp_group: dist.ProcessGroup | None, tp_group: dist.ProcessGroup | None = None) -> None:
        self.threshold = threshold
        self.layer_of = layer_of  # the block (its key in model.layers) an attention module belongs to
        self.dp_group = dp_group
        self.tp_group = tp_group  # each tp rank holds its own heads (None: every head is here)
        # Each projection's weight at rest (under FSDP2: the sharded parameter the optimizer steps; in a
        # forward the module holds the gathered one instead).
        self.resting: dict[int, torch.Tensor] = {}
        for part in model_parts:
            for m in part.modules():
                weight = getattr(m, "weight", None)
                if isinstance(weight, nn.Parameter):
                    self.resting[id(m)] = weight
        self.clipped_heads = 0  # over the run (tests)

    def at_rest(self, module: nn.Module) -> torch.Tensor:
        """The weight a projection or norm keeps between steps."""
        weight = self.resting.get(id(module), module.weight)
        assert isinstance(weight, torch.Tensor)
        return weight

    def adjust(self, heads: HeadLogits) -> tuple[torch.Tensor, torch.Tensor] | None:
        """In the measuring forward, per attention module: the maximum over every data-parallel rank, and
        the factors for its heads above the threshold (the forward goes on as the clipped model)."""
        if self.dp_group is not None:
            dist.all_reduce(heads.max, op=dist.ReduceOp.MAX, group=self.dp_group)
        if heads.norms is not None:
            return self.shared_factors(heads)
        if not bool((heads.max > self.threshold).any()):
            return None
        return head_factors(heads.max, heads.kv_heads, self.threshold)

    def shared_factors(self, heads: HeadLogits) -> tuple[torch.Tensor, torch.Tensor] | None:
        """QK-norm: sqrt of the layer's worst factor for every query and key head, the worst over every tp rank's
        heads (each rank holds some, and the norm weights are one for all); None when no head is over."""
        worst = torch.where(heads.max > self.threshold, self.threshold / heads.max,
                            torch.ones_like(heads.max)).min().reshape(1)
        if self.tp_group is not None:
            dist.all_reduce(worst, op=dist.ReduceOp.MIN, group=self.tp_group)
        if not bool(worst < 1):
            return None
        root = worst.sqrt()
        return root.expand(heads.max.numel()).clone(), root.expand(heads.kv_heads).clone()

    def after_step(self, measure: Callable[[Adjust], AttentionLogits]) -> dict[str, float]:
        """Run ``measure`` (the forward, with :meth:`adjust`), rescale the weights at rest; the per-layer
        figures ``qk_clip/<id>/...``."""
        request = measure(self.adjust)
        if not request.heads:
            raise ConfigError("stability.qk_clip_threshold needs a model whose attention records its logits "
                              "(titan_core.models.attention_logits; titan-llama's does), and this model's forward "
                              "recorded none; set stability.qk_clip_threshold=0")
        figures: dict[str, float] = {}
        for h in request.heads.values():  # every rank's modules in the same order: the gathers pair up
            maxima, factors = self.whole_heads(h)
            over = int((maxima > self.threshold).sum())
            if factors is not None:
                query, key = factors
                if h.norms is not None:  # one factor for every head (shared_factors), on each norm's weight
                    for norm, factor in zip(h.norms, (query, key)):
                        scale_all(self.at_rest(norm), factor[0])
                else:
                    scale_rows(self.at_rest(h.q_proj), h.query_rows(query, key))
                    scale_rows(self.at_rest(h.k_proj), h.key_rows(key))
                self.clipped_heads += over
            layer = self.layer_of(h.module)
            if layer is not None:
                keys = (f"{PREFIX}{layer}/{k}" for k in ("max_logit_before", "max_logit", "clipped_heads"))
                before_key, after_key, count_key = keys
                figures[before_key] = max(figures.get(before_key, -math.inf), float(maxima.max()))
                figures[after_key] = max(figures.get(after_key, -math.inf),
                                         float(maxima.clamp(max=self.threshold).max()))
                figures[count_key] = figures.get(count_key, 0) + over
        return figures

    def whole_heads(self, h: HeadLogits) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """(every head's maximum, every head's (query, key) factors or None when no head was cut): this rank's
        own without tensor parallelism, else gathered over the tp ranks in head order (rank r holds the r-th
        block of heads of a column-wise projection)."""
        if self.tp_group is None:
            return h.max, h.factors
        query, key = h.factors if h.factors is not None else (torch.ones_like(h.max),
                                                               torch.ones(h.kv_heads, device=h.max.device))
        maxima, query, key = (_gathered(t, self.tp_group) for t in (h.max, query, key))
        cut = bool((query < 1).any() or (key < 1).any())
        return maxima, ((query, key) if cut else None)


def _gathered(local: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """``local`` of every rank of ``group``, concatenated in rank order."""
    pieces = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(pieces, local.contiguous(), group=group)
    return torch.cat(pieces)

"""``metrics.layer_stats``: per transformer block, on logging steps only, the figures that tell which layer
misbehaves: parameter norm, gradient norm (before clipping), update/parameter ratio and activation RMS.

A logging step opens a :class:`StepMeasurement`: forward hooks on each block (``model.layers``) add up
the squares of its output, the gradients are measured before clipping, the parameters are copied just
before the optimizer step and compared after it; then one all-reduce over every rank gives the global
figures. Other steps install nothing and compute nothing.

Global under sharding: each rank adds the squares of its local pieces (a partial sum, such as a norm's
weight gradient under sequence parallelism, summed first), divided by the number of ranks holding the
same piece (a DTensor's Replicate mesh dimensions; a plain parameter is on every rank of its pipeline
stage), so that the sum over all ranks counts every element once. Pipeline stages hold disjoint
blocks, so a block's figures come from its own stage's ranks. An activation RMS is a ratio of two such
sums (squares over elements), which replicas scale alike.

Keys of the step's metrics record, ``<id>`` the block's key in ``model.layers``:
``layer/<id>/param_norm`` (weights before the step), ``layer/<id>/grad_norm``,
``layer/<id>/update_ratio`` (norm of the step's change over ``param_norm``), ``layer/<id>/act_rms``, and
``layer/<id>/max_attn_logit`` (the largest q.k*scale of any head in the step's forward) where the model's
attention records its logits (models/attention_logits.py).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Replicate

from ..errors import ConfigError
from ..models.attention_logits import AttentionLogits, attention_logits

PREFIX = "layer/"
STATS = ("param_norm", "grad_norm", "update_ratio", "act_rms", "max_attn_logit")
# Columns of the per-block sums reduced in one all-reduce.
_PARAM_SQ, _GRAD_SQ, _DELTA_SQ, _ACT_SQ, _ACT_COUNT = range(5)
_COLUMNS = 5


def metric_key(layer: str, stat: str) -> str:
    return f"{PREFIX}{layer}/{stat}"


def blocks_of(model_parts: list[nn.Module], blocks_attr: str = "layers") -> dict[str, nn.Module]:
    """Every block of this rank's model parts by its key in ``model.<blocks_attr>`` (a pipeline stage: its own)."""
    found: dict[str, nn.Module] = {}
    for part in model_parts:
        blocks = getattr(part, blocks_attr, None)
        if isinstance(blocks, nn.ModuleDict | nn.ModuleList):
            found.update((name, block) for name, block in blocks.named_children())
    return found


def _order(names: set[str]) -> list[str]:
    return sorted(names, key=lambda n: (0, int(n), "") if n.isdigit() else (1, 0, n))


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _copies(t: torch.Tensor, plain_copies: int) -> int:
    """How many ranks hold this rank's piece of ``t``."""
    if isinstance(t, DTensor):
        return math.prod(t.device_mesh.size(i) for i, p in enumerate(t.placements) if p.is_replicate())
    return plain_copies


def _summed(t: torch.Tensor) -> torch.Tensor:
    """``t`` with its Partial placements summed (a collective over those mesh dimensions): under sequence
    parallelism a norm's weight gradient is a partial sum on each tensor-parallel rank."""
    if isinstance(t, DTensor) and any(p.is_partial() for p in t.placements):
        return t.redistribute(t.device_mesh, [Replicate() if p.is_partial() else p for p in t.placements])
    return t


def _squares(tensors: list[torch.Tensor], plain_copies: int) -> torch.Tensor:
    """Sum over ``tensors`` of (sum of squares of the local piece) / copies, float64 on the device."""
    total = torch.zeros((), dtype=torch.float64, device=_local(tensors[0]).device)
    for t in map(_summed, tensors):
        total += torch.linalg.vector_norm(_local(t), 2.0, dtype=torch.float64).square() / _copies(t, plain_copies)
    return total


class LayerStats:
    """The run's per-block statistics: built once (it learns every rank's block names), measures logging steps."""

    def __init__(self, model_parts: list[nn.Module], *, distributed: bool, stage_ranks: int) -> None:
        local = blocks_of(model_parts)
        names = set(local)
        if distributed:  # a pipeline stage holds some blocks: the record names them all, in one order everywhere
            gathered: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, sorted(local))
            names = {n for ranks in gathered for n in ranks}
        if not names:
            raise ConfigError("metrics.layer_stats=true needs the model's transformer blocks in model.layers (an "
                              "nn.ModuleDict keyed by layer id, or an nn.ModuleList), and this model has none; set "
                              "metrics.layer_stats=false")
        self.layers = _order(names)
        self.row = {name: i for i, name in enumerate(self.layers)}
        self.blocks = local
        self.owner = {id(m): self.row[name] for name, block in local.items() for m in block.modules()}
        self.params = {name: [p for p in block.parameters() if p.requires_grad] for name, block in local.items()}
        self.distributed = distributed
        self.plain_copies = stage_ranks  # ranks of a pipeline stage: each holds a plain (unsharded) tensor
        self.device = next((p.device for ps in self.params.values() for p in ps), torch.device("cpu"))
        self.measured_steps = 0  # steps measured so far (tests: a non-logging step adds none)

    def open(self) -> StepMeasurement:
        """Start measuring the step about to run: installs the activation hooks."""
        self.measured_steps += 1
        return StepMeasurement(self)


class StepMeasurement:
    """One logging step's measurement; call the methods in the step's order, ``close`` in every case."""

    def __init__(self, stats: LayerStats) -> None:
        self.stats = stats
        self.sums = torch.zeros(len(stats.layers), _COLUMNS, dtype=torch.float64, device=stats.device)
        self.maxima = torch.full((len(stats.layers),), -math.inf, dtype=torch.float64, device=stats.device)
        self.before: dict[str, list[torch.Tensor]] = {}
        self.handles = [block.register_forward_hook(self._activation_hook(stats.row[name]))
                        for name, block in stats.blocks.items()]
        self.logits_request = attention_logits()
        self.logits: AttentionLogits | None = self.logits_request.__enter__()
        # A pipeline stage's first step runs one forward to learn its shapes (parallel/pipeline.py), then calls
        # discard_forward_records() on its modules: the blocks offer it while measured.
        self.offered = [block for block in stats.blocks.values() if not hasattr(block, "discard_forward_records")]
        for block in self.offered:
            object.__setattr__(block, "discard_forward_records", self.discard_forward_records)  # not a Module attribute

    def discard_forward_records(self) -> None:
        """Forget the activations and logits recorded so far (a forward that was not the step's)."""
        self.sums[:, _ACT_SQ] = 0
        self.sums[:, _ACT_COUNT] = 0
        if self.logits is not None:
            self.logits.heads.clear()

    def _activation_hook(self, row: int) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            out = output[0] if isinstance(output, tuple | list) else output
            if not isinstance(out, torch.Tensor):
                return
            local = _local(out.detach())
            self.sums[row, _ACT_SQ] += torch.linalg.vector_norm(local, 2.0, dtype=torch.float64).square()
            self.sums[row, _ACT_COUNT] += local.numel()
        return hook

    def close(self) -> None:
        """Remove the hooks, end the logits request and drop the copies (idempotent)."""
        self._stop_watching()
        self.before = {}

    def _stop_watching(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
        for block in self.offered:
            delattr(block, "discard_forward_records")
        self.offered = []
        if self.logits is not None:
            self.logits_request.__exit__(None, None, None)
            for heads in self.logits.heads.values():
                row = self.stats.owner.get(id(heads.module))
                if row is not None:
                    self.maxima[row] = torch.maximum(self.maxima[row], heads.max.max().to(self.maxima.dtype))
            self.logits = None

    @torch.no_grad()
    def after_backward(self) -> None:
        """The gradients as backward left them (before clipping); the forwards are over: the hooks go."""
        self._stop_watching()
        for name, params in self.stats.params.items():
            grads = [p.grad for p in params if p.grad is not None]
            if grads:
                self.sums[self.stats.row[name], _GRAD_SQ] = _squares(grads, self.stats.plain_copies)

    @torch.no_grad()
    def before_update(self) -> None:
        """Copy the weights the optimizer is about to change (this rank's pieces)."""
        for name, params in self.stats.params.items():
            if params:
                self.before[name] = [_local(p).detach().clone() for p in params]
                self.sums[self.stats.row[name], _PARAM_SQ] = _squares(list(params), self.stats.plain_copies)

    @torch.no_grad()
    def after_update(self) -> dict[str, float]:
        """The step's change, then the global figures (a collective on every rank): the record's ``layer/*`` keys."""
        for name, params in self.stats.params.items():
            before = self.before.get(name)
            if before is None:
                continue
            delta = torch.zeros((), dtype=torch.float64, device=self.sums.device)
            for p, old in zip(params, before):
                change = torch.linalg.vector_norm(_local(p).double() - old.double(), 2.0)
                delta += change.square() / _copies(p, self.stats.plain_copies)
            self.sums[self.stats.row[name], _DELTA_SQ] = delta
        self.close()
        sums, maxima = self.sums, self.maxima
        if self.stats.distributed:
            dist.all_reduce(sums, op=dist.ReduceOp.SUM)
            dist.all_reduce(maxima, op=dist.ReduceOp.MAX)
        return figures(self.stats.layers, sums.cpu().tolist(), maxima.cpu().tolist())


def figures(layers: list[str], sums: list[list[float]], maxima: list[float]) -> dict[str, float]:
    """The record's keys from each block's global sums (a block without activations or weights: NaN there)
    and largest attention logits (left out where no attention recorded one)."""
    out: dict[str, float] = {}
    for name, row, largest in zip(layers, sums, maxima):
        if math.isfinite(largest):
            out[metric_key(name, "max_attn_logit")] = largest
        param = math.sqrt(row[_PARAM_SQ])
        out[metric_key(name, "param_norm")] = param
        out[metric_key(name, "grad_norm")] = math.sqrt(row[_GRAD_SQ])
        out[metric_key(name, "update_ratio")] = math.sqrt(row[_DELTA_SQ]) / param if param > 0 else math.nan
        count = row[_ACT_COUNT]
        out[metric_key(name, "act_rms")] = math.sqrt(row[_ACT_SQ] / count) if count > 0 else math.nan
    return out


"""Pipeline parallelism for any decoder whose blocks sit in one ``nn.ModuleDict``: split into
stages, parallelize each, build the schedule. A spec gets its ``pipelining_fn`` from
:func:`default_pipelining_fn` (naming its blocks and its two ends) and its layout checks from
:func:`validate_pipeline`.

A stage is a deep copy of the meta-device model with the blocks of other stages deleted
and the first-stage modules (e.g. ``tok_embeddings``; all but the first stage) or the
last-stage ones (e.g. ``norm`` and ``output``; all but the last) set to None: the model's
forward must skip an end that is None (a later stage receives hidden states). Nothing is
renamed, so a stage's parameter names are the whole model's (``layers.5.attention.wq.weight``
stays that on whichever rank holds block 5): checkpoints and weight init do not depend on
the split.

Stages are numbered 0..S-1 with S = pp x pp_stages_per_rank. Rank r of the
``pp`` mesh holds stages r, r+pp, r+2pp, ... ("loop" style), or for the V-shaped
schedules (ZBVZeroBubble, DualPipeV) stages r and 2pp-1-r, so the first and the
last stage share rank 0.

How the trainer drives the schedule (per optimizer step, after zero_grad):
  * ``losses = []``; rank with the first stage passes the inputs, rank with the
    last stage the targets: ``schedule.step(*([tokens] if has_first_stage else []),
    target=labels if has_last_stage else None, losses=losses if has_last_stage else None)``.
  * ``loss_fn(output, target)`` runs once per microbatch and must return the MEAN
    over that microbatch; the schedule divides the gradients by the number of
    microbatches (``scale_grads=True``), so the gradients are those of the mean
    over the local batch. That division covers every gradient of the stages, so with
    gradient accumulation (several ``step`` calls per optimizer step) the trainer first
    multiplies the gradients the earlier calls left by the same count. The step's loss is
    ``torch.stack(losses).mean()``, known
    only on the last stage's rank: broadcast (or all-reduce a masked value) over
    the ``pp`` mesh to log it everywhere.
  * with tp > 1 and ``parallelism.loss_parallel``, run ``schedule.step`` inside
    ``torch.distributed.tensor.parallel.loss_parallel()`` on every rank (the loss
    and its backward both run inside ``step``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..config.parallel_dims import ParallelDims
from ..config.sections import ParallelismSection, TrainingSection
from ..errors import ConfigError, TitanError
from ..plugin.resolved import resolve_compute_dtype
from ..plugin.spec_factories import PipeliningFn
from .fake_group import is_fake_group
from .fsdp import gather_dtype

# Schedules offered, in the spelling torch's get_schedule_class accepts.
SINGLE_STAGE_SCHEDULES = ("1F1B", "GPipe")
MULTI_STAGE_SCHEDULES = ("Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
V_SCHEDULES = ("ZBVZeroBubble", "DualPipeV")
# Zero-bubble schedules split each backward in two passes (the inputs' gradient first, the weights' later), so
# autograd reaches the loss twice: the chunked loss, which hands back gradients it computed in the forward
# once, is off under them.
SPLIT_BACKWARD_SCHEDULES = ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")


@dataclass
class PipelineResult:
    """What the trainer needs to run a pipeline step on this rank."""

    schedule: Any
    model_parts: list[nn.Module]
    has_first_stage: bool
    has_last_stage: bool
    stage_ids: list[int]


def splits_backward(parallelism: ParallelismSection) -> bool:
    """Whether this run's pipeline schedule runs each backward in two passes (SPLIT_BACKWARD_SCHEDULES)."""
    return parallelism.pp > 1 and canonical_schedule(parallelism.pp_schedule) in SPLIT_BACKWARD_SCHEDULES


def canonical_schedule(name: str) -> str:
    """The schedule's canonical name (case-insensitive match); ConfigError listing the valid ones."""
    for known in (*SINGLE_STAGE_SCHEDULES, *MULTI_STAGE_SCHEDULES):
        if known.lower() == name.lower():
            return known
    valid = ", ".join((*SINGLE_STAGE_SCHEDULES, *MULTI_STAGE_SCHEDULES))
    raise ConfigError(f'parallelism.pp_schedule: unknown pipeline schedule "{name}". Valid schedules: {valid}.')


def validate_pipeline(parallelism: ParallelismSection, training: TrainingSection, *, n_layers: int) -> None:
    """Check schedule, stages and microbatches against the model and batch (ConfigError)."""
    schedule = canonical_schedule(parallelism.pp_schedule)
    per_rank = parallelism.pp_stages_per_rank
    if schedule in SINGLE_STAGE_SCHEDULES and per_rank != 1:
        raise ConfigError(
            f"parallelism.pp_schedule={schedule} runs one stage per rank, but pp_stages_per_rank={per_rank}. "
            f"Set pp_stages_per_rank=1 or use a multi-stage schedule ({', '.join(MULTI_STAGE_SCHEDULES)})."
        )
    if schedule in MULTI_STAGE_SCHEDULES and per_rank < 2:
        raise ConfigError(
            f"parallelism.pp_schedule={schedule} runs several stages per rank, but pp_stages_per_rank={per_rank}. "
            f"Set pp_stages_per_rank to 2 or more, or use a single-stage schedule ({', '.join(SINGLE_STAGE_SCHEDULES)})."
        )
    if schedule in V_SCHEDULES and per_rank != 2:
        raise ConfigError(f"parallelism.pp_schedule={schedule} needs exactly pp_stages_per_rank=2, got {per_rank}.")
    num_stages = parallelism.pp * per_rank
    if num_stages > n_layers:
        raise ConfigError(
            f"pipeline has more stages than the model has layers: pp={parallelism.pp} x pp_stages_per_rank={per_rank} "
            f"= {num_stages} stages, n_layers={n_layers}. Each stage needs at least one layer: lower pp or "
            f"pp_stages_per_rank."
        )
    n_mb = parallelism.pp_microbatches or num_stages  # dividing the local batch: checked by the core's config
    if schedule in ("1F1B", "Interleaved1F1B") and n_mb < parallelism.pp:
        raise ConfigError(
            f"parallelism.pp_schedule={schedule} needs at least pp={parallelism.pp} microbatches, got {n_mb}."
        )
    split_layers(n_layers, num_stages, parallelism.pp_split_points, fewer_at_ends=parallelism.pp_end_stage_fewer_layers)


def end_stage_fewer_layers(setting: int, n_layers: int, num_stages: int) -> int:
    """``parallelism.pp_end_stage_fewer_layers`` resolved: ``-1`` is 1 when every stage would hold at least 4 layers."""
    if setting >= 0:
        return setting
    return 1 if num_stages > 1 and n_layers >= 4 * num_stages else 0


def _balanced_sizes(n_layers: int, num_stages: int, fewer: int) -> list[int]:
    """Layers per stage: even, the first and the last stage counted as holding ``fewer`` more (the embedding,
    the head and, on the first, the most micro-batches in flight), the remainder to the middle stages first.
    With ``fewer=0`` the remainder goes to the earliest stages (the split of earlier versions)."""
    base, extra = divmod(n_layers + 2 * fewer, num_stages)
    if fewer == 0 or num_stages == 1:
        return [base + (1 if s < extra else 0) for s in range(num_stages)]
    order = [*range(1, num_stages - 1), 0, num_stages - 1]
    sizes = [base] * num_stages
    for s in order[:extra]:
        sizes[s] += 1
    sizes[0] -= fewer
    sizes[-1] -= fewer
    if min(sizes) < 1:
        raise ConfigError(
            f"parallelism.pp_end_stage_fewer_layers={fewer} leaves the first or last stage without a layer "
            f"({n_layers} layers over {num_stages} stages); lower it (0 splits evenly)."
        )
    return sizes


def split_layers(n_layers: int, num_stages: int, split_points: list[str], *, fewer_at_ends: int = 0) -> list[list[str]]:
    """Layer names ("0".."n-1") of each stage: balanced (``fewer_at_ends``: see ``end_stage_fewer_layers``),
    or cut before each ``layers.K`` in ``split_points``."""
    if not split_points:
        fewer = end_stage_fewer_layers(fewer_at_ends, n_layers, num_stages)
        sizes = _balanced_sizes(n_layers, num_stages, fewer)
        starts = [sum(sizes[:s]) for s in range(num_stages)]
    else:
        if len(split_points) != num_stages - 1:
            raise ConfigError(
                f"parallelism.pp_split_points has {len(split_points)} entries but {num_stages} stages need "
                f"{num_stages - 1} (one per stage boundary). Give {num_stages - 1} names like \"layers.4\", or none "
                f"for a balanced split."
            )
        starts = [0]
        for point in split_points:
            index = _layer_index(point, n_layers)
            if index <= starts[-1]:
                raise ConfigError(
                    f'parallelism.pp_split_points must name increasing layers from "layers.1" to '
                    f'"layers.{n_layers - 1}" (each stage keeps at least one layer); got {split_points}.'
                )
            starts.append(index)
    ends = [*starts[1:], n_layers]
    return [[str(i) for i in range(a, b)] for a, b in zip(starts, ends)]


def _layer_index(point: str, n_layers: int) -> int:
    prefix, _, number = point.partition(".")
    # ASCII digits, no more than a layer count has: int() refuses "³" (a digit to isdigit) and a number of over
    # 4,300 digits, which ended the run as the core's own failure instead of this message.
    if (prefix != "layers" or not (number.isascii() and number.isdigit()) or len(number) > 18
            or not 0 < int(number) < n_layers):
        raise ConfigError(
            f'parallelism.pp_split_points: "{point}" is not a layer that can start a stage; use '
            f'"layers.K" with 1 <= K <= {n_layers - 1}.'
        )
    return int(number)


def stage_ids_of_rank(pp_rank: int, pp: int, stages_per_rank: int, *, v_style: bool) -> list[int]:
    """The stages rank ``pp_rank`` holds, in increasing order."""
    if v_style:
        return [pp_rank, 2 * pp - 1 - pp_rank]
    return [pp_rank + k * pp for k in range(stages_per_rank)]


def build_stage_module(model: nn.Module, layer_names: list[str], *, is_first: bool, is_last: bool,
                       blocks_attr: str = "layers", first: Sequence[str] = ("tok_embeddings",),
                       last: Sequence[str] = ("norm", "output")) -> nn.Module:
    """A copy of the meta ``model`` holding only the blocks ``layer_names`` (and its ``first`` /
    ``last`` modules when it is the first / last stage)."""
    whole = model.get_submodule(blocks_attr)
    if not isinstance(whole, nn.ModuleDict):
        raise TypeError(f"pipelining splits model.{blocks_attr}, which must be an nn.ModuleDict keyed by layer id "
                        f"(so a stage keeps the layers' names); {type(model).__name__} has {type(whole).__name__}")
    keep = set(layer_names)
    # What the stage drops is not copied: the copy refers to the original until it is removed from
    # the copy below (copying all 126 blocks of a 405B model for each stage costs seconds).
    dropped: list[nn.Module | None] = [block for name, block in whole.items() if name not in keep]
    dropped += [getattr(model, attr, None) for attr in (() if is_first else tuple(first)) + (() if is_last else tuple(last))]
    memo: dict[int, Any] = {id(m): m for m in dropped if m is not None}
    part = copy.deepcopy(model, memo)
    blocks = part.get_submodule(blocks_attr)
    assert isinstance(blocks, nn.ModuleDict)
    for name in list(blocks.keys()):
        if name not in keep:
            del blocks[name]
    for attr in (() if is_first else tuple(first)) + (() if is_last else tuple(last)):
        setattr(part, attr, None)  # the model's forward skips an end that is None
    return part


def discard_forward_records(model: nn.Module) -> None:
    """Call ``discard_forward_records()`` of every module of ``model`` that offers it, after a forward the
    training step does not have (torch's shape-finding forward, the dry run's activation probe)."""
    for module in model.modules():
        discard = getattr(module, "discard_forward_records", None)
        if callable(discard):
            discard()


def _stage_class(*, alone: bool = False) -> Any:
    """torch's PipelineStage, told to make its metadata forward leave no records.

    On the first step torch runs each stage's forward once, with the first micro-batch (or
    empty tensors of its shapes), to learn the shapes it sends: a forward the training step
    does not have. Modules that add something up over forwards (a MoE block's tokens per
    expert) offer ``discard_forward_records()``, called after that forward.

    ``alone`` (rehearsal, under the fake process group: this rank's neighbours do not exist): the
    stages were given their shapes (:func:`static_stage_args`), and the vote torch's schedule
    takes first over the pipeline ("does every stage know its shapes?", a tensor sent stage to
    stage) is answered here: the fake group's receives hold nothing, which would read as a no.
    """
    from torch.distributed.pipelining import PipelineStage

    if not hasattr(PipelineStage, "_forward_metadata_inference"):
        return PipelineStage  # a torch without that forward

    class Stage(PipelineStage):
        def _forward_metadata_inference(self, *args: Any, **kwargs: Any) -> Any:
            out = super()._forward_metadata_inference(*args, **kwargs)
            discard_forward_records(self.submod)
            return out

    if not alone or not hasattr(PipelineStage, "_warmup_forward_vote"):
        return Stage

    class LoneStage(Stage):
        def _warmup_forward_vote(self, *args: Any, **kwargs: Any) -> torch.Tensor:
            return torch.ones(1, dtype=torch.int32, device=self.device)  # every stage was given its shapes

        def _warmup_backward_result(self, *args: Any, **kwargs: Any) -> torch.Tensor:
            return torch.ones(1, dtype=torch.int32, device=self.device)

    return LoneStage


def static_stage_args(model: nn.Module, *, is_first: bool, parallel_dims: ParallelDims,
                      parallelism: ParallelismSection, training: TrainingSection, device: torch.device,
                      first: Sequence[str] = ("tok_embeddings",)) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Meta tensors of what a stage receives and sends per micro-batch, known before any step: the
    first stage takes token ids ``[micro-batch, seq_len / cp]``; every stage sends the residual stream,
    ``[micro-batch, seq_len / cp / tp, dim]`` (context parallelism gives each rank its chunks of the
    sequence; tensor parallelism shards the stream on the sequence: tp_plans.py),
    in FSDP's gather dtype when the stages are sharded or replicated over data- or context-parallel
    ranks (the embedding's output is), else in the
    weights' dtype (autocast leaves the residual additions in it). The last stage's output is sent
    nowhere; it is given the same meta tensor. None when the model's first module is not one
    ``nn.Embedding`` (the dimension is read from it): torch then learns the shapes at the first step.
    """
    embedding = getattr(model, first[0], None) if len(first) == 1 else None
    if not isinstance(embedding, nn.Embedding):
        return None
    n_mb = parallelism.pp_microbatches or parallelism.pp * parallelism.pp_stages_per_rank
    rows = training.local_batch_size // n_mb
    local_seq = training.seq_len // parallel_dims.cp
    seq = local_seq // parallel_dims.tp
    if parallel_dims.dp_cp > 1:  # FSDP2 (or replicate) over dp and cp ranks casts what it gathers (fsdp.py)
        dtype = gather_dtype(parallelism, resolve_compute_dtype(training.dtype, device))
    else:
        dtype = embedding.weight.dtype
    # requires_grad: the stream's gradient flows back (torch sizes the gradient buffers from these)
    hidden = torch.empty(rows, seq, embedding.embedding_dim, dtype=dtype, device="meta", requires_grad=True)
    tokens = torch.empty(rows, local_seq, dtype=torch.long, device="meta")
    return (tokens if is_first else hidden), hidden


def _check_what_is_sent(stage: Any, stage_id: int, expected: torch.Tensor) -> None:
    """Check each micro-batch's output of the schedule's forward before it is sent (not a module hook: the
    evaluation runs the stage modules on batches of its own shape, outside the schedule)."""
    forward_one_chunk = stage.forward_one_chunk
    check = _sends_as_declared(stage_id, expected)

    def checked(*args: Any, **kwargs: Any) -> Any:
        output = forward_one_chunk(*args, **kwargs)
        check(output)
        return output

    stage.forward_one_chunk = checked


def _sends_as_declared(stage: int, expected: torch.Tensor) -> Callable[[Any], None]:
    """Whether the stage's output is what its neighbour's receive buffer was built for (ConfigError if not)."""

    def check(output: Any) -> None:
        sent = output[0] if isinstance(output, tuple) and len(output) == 1 else output
        if isinstance(sent, torch.Tensor) and sent.shape == expected.shape and sent.dtype == expected.dtype:
            return
        what = (f"{tuple(sent.shape)} {str(sent.dtype).removeprefix('torch.')}" if isinstance(sent, torch.Tensor)
                else type(output).__name__)
        raise ConfigError(
            f"pipeline stage {stage} sends {what}, but the next stage was built to receive "
            f"{tuple(expected.shape)} {str(expected.dtype).removeprefix('torch.')} (the residual stream "
            f"[micro-batch, seq_len / cp / tp, dim], parallelism.pp_static_shapes=true). If this spec's stages "
            f"send something else, set --parallelism.pp_static_shapes=false: torch then learns the shapes from "
            f"the first micro-batch.")

    return check


def step_schedule(schedule: Any, *args: Any, **kwargs: Any) -> None:
    """One step of a pipeline schedule; an error of ours raised in a stage comes out as itself (torch wraps
    whatever a stage raises in a RuntimeError, which would print a traceback instead of its message)."""
    try:
        schedule.step(*args, return_outputs=False, **kwargs)
    except RuntimeError as exc:
        if isinstance(exc.__cause__, TitanError):
            raise exc.__cause__ from None
        raise


def default_pipelining_fn(*, blocks_attr: str = "layers", first: Sequence[str] = ("tok_embeddings",),
                          last: Sequence[str] = ("norm", "output")) -> PipeliningFn:
    """A spec's ``pipelining_fn`` for a model whose blocks are ``model.<blocks_attr>`` (an
    ``nn.ModuleDict``), whose first stage alone keeps the modules ``first`` and whose last
    stage alone keeps the modules ``last`` (attributes of the model)."""

    def pipeline(model: nn.Module, **kwargs: Any) -> PipelineResult:
        return pipeline_model(model, blocks_attr=blocks_attr, first=first, last=last, **kwargs)

    return pipeline


def pipeline_model(
    model: nn.Module,
    *,
    parallel_dims: ParallelDims,
    mesh: Any,
    parallelism: ParallelismSection,
    training: TrainingSection,
    device: torch.device,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    parallelize: Callable[[nn.Module], nn.Module],
    blocks_attr: str = "layers",
    first: Sequence[str] = ("tok_embeddings",),
    last: Sequence[str] = ("norm", "output"),
) -> PipelineResult:
    """Split the meta ``model`` into this rank's stages, ``parallelize`` each, and build the schedule."""
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

    n_layers = len(list(model.get_submodule(blocks_attr).children()))
    validate_pipeline(parallelism, training, n_layers=n_layers)
    name = canonical_schedule(parallelism.pp_schedule)
    pp, per_rank = parallel_dims.pp, parallelism.pp_stages_per_rank
    num_stages = pp * per_rank
    stage_layers = split_layers(n_layers, num_stages, parallelism.pp_split_points,
                                fewer_at_ends=parallelism.pp_end_stage_fewer_layers)
    pp_mesh = mesh["pp"]
    ids = stage_ids_of_rank(pp_mesh.get_local_rank(), pp, per_rank, v_style=name in V_SCHEDULES)

    # Under the fake process group (rehearsal) no stage can learn its neighbour's shapes, so they are
    # given. On a real run too by default (parallelism.pp_static_shapes): torch would otherwise learn them
    # from the first micro-batch, a pickled handshake between neighbours, and each sent output is checked
    # against them, so a spec whose stages send something else stops with a message, not garbage.
    alone = is_fake_group()
    static = alone or parallelism.pp_static_shapes
    parts: list[nn.Module] = []
    stages = []
    for sid in ids:
        part = build_stage_module(model, stage_layers[sid], is_first=sid == 0, is_last=sid == num_stages - 1,
                                  blocks_attr=blocks_attr, first=first, last=last)
        part = parallelize(part)
        parts.append(part)
        shapes = static_stage_args(model, is_first=sid == 0, parallel_dims=parallel_dims, parallelism=parallelism,
                                   training=training, device=device, first=first) if static else None
        if alone and shapes is None and device.type != "meta":  # the dry run's plan never runs a step
            raise ConfigError(f"rehearsing a pipeline needs the stages' shapes before the first step, read from the "
                              f"model's embedding: {type(model).__name__}.{first[0]} is not one nn.Embedding.")
        inputs, outputs = shapes if shapes is not None else (None, None)
        stage = _stage_class(alone=alone)(part, sid, num_stages, device, input_args=inputs, output_args=outputs,
                                          group=pp_mesh.get_group())
        if outputs is not None and sid != num_stages - 1:  # rehearsal too: its stages compute real shapes
            _check_what_is_sent(stage, sid, outputs)
        stages.append(stage)

    n_microbatches = parallelism.pp_microbatches or num_stages
    schedule_cls = get_schedule_class(name)
    if issubclass(schedule_cls, PipelineScheduleSingle):
        schedule = schedule_cls(stages[0], n_microbatches=n_microbatches, loss_fn=loss_fn)
    else:
        schedule = schedule_cls(stages, n_microbatches=n_microbatches, loss_fn=loss_fn)
    return PipelineResult(
        schedule=schedule,
        model_parts=parts,
        has_first_stage=0 in ids,
        has_last_stage=num_stages - 1 in ids,
        stage_ids=ids,
    )


__all__ = [
    "MULTI_STAGE_SCHEDULES",
    "PipelineResult",
    "SINGLE_STAGE_SCHEDULES",
    "SPLIT_BACKWARD_SCHEDULES",
    "V_SCHEDULES",
    "build_stage_module",
    "canonical_schedule",
    "default_pipelining_fn",
    "end_stage_fewer_layers",
    "pipeline_model",
    "split_layers",
    "splits_backward",
    "step_schedule",
    "stage_ids_of_rank",
    "static_stage_args",
    "validate_pipeline",
]

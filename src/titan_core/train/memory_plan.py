"""The memory plan: what each kind of rank of a layout holds at its peak, from any machine.

``titan-train --dry-run`` builds the model on meta and, for each pipeline rank (every rank with
the same pipeline coordinate holds the same shapes), parallelizes it as that rank would under
torch's fake process group (``parallel/fake_group.py``): the parameter counts are those of the
real shards. On top of them come, per rank:

* gradients (float32, sharded as the weights) and the optimizer's state (AdamW: two float32
  moments per local parameter; with ``[ema]`` one float32 average more, counted in ``optim``);
* activations of the micro-batches in flight, per the activation-checkpointing mode, measured by
  one forward on meta (``activation_probe.py``) and divided by tp (sequence parallelism splits
  what tensor parallelism does not), except what tensor parallelism keeps whole: the gathered inputs
  of the column-wise linears and, under per-op selective AC, the row-wise linears' partial-sum
  outputs (``layer_activations``); with context parallelism the forward is of seq_len / cp tokens; with ``full`` one block's activations live again during its
  recompute; and the gradients of one block's activations while it is back-propagated (two of
  its largest saved tensors);
* on the last stage, the loss moment (column ``logits``): what the head and final norm saved, the
  logits and the loss's float32 copies (vocabulary split over tp); with ``training.chunked_loss``
  (the default), one chunk's. The loss is over before the blocks' backward starts, so the loss
  moment and a block's recompute and gradients are never live together: the peak of live tensors
  (``StageMemory.live``) counts the larger of the two; the total, what the device must have, counts
  both, as an allocator (glibc's heap as this project tunes it, CUDA's caching allocator) keeps what
  the loss freed for blocks of other sizes;
* FSDP2's buffers: gathered blocks in the gather dtype (two blocks in flight, the root for the
  whole step, every block of a stage with pipelining, which keeps them gathered) and two blocks'
  unsharded gradients before their reduce-scatter (with pipelining, the whole stage's: torch's
  stages sync gradients only after the last micro-batch, accumulating them unsharded);
* pipeline send/receive buffers; on an accelerator a fixed allowance for the CUDA context, NCCL
  and the caching allocator's slack (``RUNTIME_ALLOWANCE``).

Nothing reads this machine's memory unless the plan is for this machine.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..config.sections import ActivationCheckpointSection
from ..errors import ConfigError
from ..parallel.context_parallel import supports_context_parallel
from ..parallel.fake_group import fake_process_group
from ..parallel.pipeline import MULTI_STAGE_SCHEDULES, canonical_schedule, splits_backward
from ..parallel.precision import resolve_compute_dtype
from .activation_probe import ActivationProbe, probe_activations
from .build import parallelize_part
from .chunked_loss import rows_per_chunk
from .schedule_peak import peak_in_flight_bytes, schedule_program
from .target_devices import GIB, TargetDevice
from .tp_styles import resolve_tp_styles

if TYPE_CHECKING:
    from ..plan.resolve import ResolvedConfig

OPTIMIZER_STATE_BYTES = {"AdamW": 8, "Adam": 8, "SGD": 0}
#: CUDA context, NCCL's buffers and the caching allocator's slack on an accelerator (an allowance, not measured)
RUNTIME_ALLOWANCE = int(2.5 * GIB)
COLUMNS = ("params", "grads", "optim", "activ", "logits", "fsdp", "pipe", "runtime")
#: the largest FSDP2 shard group a plan sets up on meta (see ``check_plannable``)
MAX_PLANNED_SHARD_RANKS = 16_384


@dataclass(frozen=True)
class StageMemory:
    """One pipeline rank's peak, in bytes, by part (``COLUMNS``)."""

    pp_rank: int
    rank: int
    stage_ids: tuple[int, ...]
    layers: int
    local_params: int
    params: int
    grads: int
    optim: int
    activ: int
    logits: int
    fsdp: int
    pipe: int
    runtime: int
    # Bytes of two columns that are never live at the same moment (the loss moment in ``logits``, the
    # backward's recompute and gradients in ``activ``): the smaller of the two
    not_at_once: int = 0

    @property
    def total(self) -> int:
        """What the device must have: every column, as the allocator keeps what the loss moment freed (its
        blocks are sized for logits chunks, not for the backward's tensors)."""
        return sum(getattr(self, c) for c in COLUMNS)

    @property
    def live(self) -> int:
        """The peak of live tensor bytes: the total less what is never live at once."""
        return self.total - self.not_at_once

    @property
    def states(self) -> int:
        return self.params + self.grads + self.optim


@dataclass(frozen=True)
class StageShape:
    """What the fake-group build of one pipeline rank gave: its local parameters and its blocks."""

    pp_rank: int
    rank: int
    stage_ids: tuple[int, ...]
    layer_names: tuple[str, ...]
    has_last: bool
    local_params: int
    param_bytes: int
    gather_root: int  # bytes of the root's (non-block) parameters once gathered, in float32
    gather_blocks: tuple[int, ...]  # each block's gathered bytes, in float32
    # Under tensor parallelism, the block weights (names in the block) split by output (column-wise: their
    # inputs are gathered whole) and by input (row-wise: their outputs are whole partial sums)
    tp_columnwise: frozenset[str] = frozenset()
    tp_rowwise: frozenset[str] = frozenset()
    # The block names of each of the rank's stages, in stage order (a multi-stage schedule's rank has several)
    stage_layers: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True)
class MemoryPlan:
    title: str
    stages: list[StageMemory]
    device: TargetDevice | None
    ac_mode: str
    notes: list[str]

    @property
    def peak(self) -> StageMemory:
        return max(self.stages, key=lambda s: s.total)

    def fits(self) -> bool | None:
        return None if self.device is None else self.peak.total <= self.device.memory_bytes


# ---- building each pipeline rank under the fake process group --------------------------------------------------


def _gathered_numel(p: torch.Tensor) -> int:
    """The parameter's size once FSDP2 has gathered it: whole, except over the tensor- and expert-parallel
    mesh dimensions, which stay split."""
    mesh, placements = getattr(p, "device_mesh", None), getattr(p, "placements", None)
    if mesh is None or placements is None:
        return int(p.numel())
    names = mesh.mesh_dim_names or ()
    split = 1
    for dim, placement in enumerate(placements):
        if dim < len(names) and names[dim] in ("tp", "ep") and not placement.is_replicate():
            split *= mesh.size(dim)
    return math.ceil(p.numel() / split)


def _local_numel(p: torch.Tensor) -> int:
    to_local = getattr(p, "to_local", None)
    return int(to_local().numel()) if to_local is not None else int(p.numel())


def _gathered_bytes(module: nn.Module, *, recurse: bool, skip: set[int]) -> int:
    total = 0
    for p in module.parameters(recurse=recurse):
        if id(p) not in skip:
            total += _gathered_numel(p) * 4
    return total


def _blocks_of(part: nn.Module, blocks_attr: str) -> nn.Module | None:
    try:
        return part.get_submodule(blocks_attr)
    except AttributeError:
        return None


def _tp_split(block: nn.Module) -> tuple[set[str], set[str]]:
    """The names of the block's 2-D weights split over the tp mesh dimension by output (dim 0) and by input."""
    columnwise: set[str] = set()
    rowwise: set[str] = set()
    for name, p in block.named_parameters():
        mesh, placements = getattr(p, "device_mesh", None), getattr(p, "placements", None)
        if mesh is None or placements is None or p.dim() != 2 or "tp" not in (mesh.mesh_dim_names or ()):
            continue
        placement = placements[list(mesh.mesh_dim_names).index("tp")]
        dim = getattr(placement, "dim", None)
        if placement.is_shard() and dim is not None:
            (columnwise if dim == 0 else rowwise).add(name)
    return columnwise, rowwise


def _stage_shape(part_list: list[nn.Module], *, pp_rank: int, rank: int, stage_ids: tuple[int, ...], has_last: bool,
                 blocks_attr: str) -> StageShape:
    columnwise: set[str] = set()
    rowwise: set[str] = set()
    names: list[str] = []
    blocks_bytes: list[int] = []
    root = 0
    local = 0
    param_bytes = 0
    for part in part_list:
        block_params: set[int] = set()
        blocks = _blocks_of(part, blocks_attr)
        if blocks is not None:
            for name, block in blocks.named_children():
                names.append(name)
                blocks_bytes.append(_gathered_bytes(block, recurse=True, skip=set()))
                col, row = _tp_split(block)
                columnwise |= col
                rowwise |= row
                block_params |= {id(p) for p in block.parameters()}
        root += sum(_gathered_numel(p) * 4 for p in part.parameters() if id(p) not in block_params)
        for p in part.parameters():
            n = _local_numel(p)
            local += n
            param_bytes += n * p.element_size()
    return StageShape(pp_rank, rank, stage_ids, tuple(names), has_last, local, param_bytes, root, tuple(blocks_bytes),
                      frozenset(columnwise), frozenset(rowwise), _stage_layers(part_list, blocks_attr))


def _stage_layers(part_list: list[nn.Module], blocks_attr: str) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(n for n, _ in b.named_children()) if (b := _blocks_of(part, blocks_attr)) is not None else ()
                 for part in part_list)


def build_stage_shapes(resolved: ResolvedConfig, model: nn.Module, *, blocks_attr: str = "layers") -> list[StageShape]:
    """Each pipeline rank's parts, parallelized on meta as its first rank would (fake process group).

    Pipeline ranks whose parts have the same structure (the same modules and parameter shapes,
    block numbers aside) shard the same way: those are parallelized once.
    """
    dims = resolved.dims
    check_plannable(dims.dp_shard * dims.cp)
    styles = resolve_tp_styles([])
    if not dims.distributed:
        part = parallelize_part(resolved, model, mesh=None, tp_styles=styles)
        return [_stage_shape([part], pp_rank=0, rank=0, stage_ids=(0,), has_last=True, blocks_attr=blocks_attr)]
    per_pp = dims.world_size // dims.pp
    shapes: list[StageShape] = []
    built: dict[tuple[object, ...], StageShape] = {}
    for pp_rank in range(dims.pp):
        rank = pp_rank * per_pp  # mesh order (pp, dp_replicate, dp_shard, tp): the pp coordinate is the slowest
        with fake_process_group(rank=rank, world_size=dims.world_size):
            mesh, _ = dims.build_meshes("cpu")
            if not dims.pp_enabled:
                part = parallelize_part(resolved, model, mesh=mesh, tp_styles=styles)
                shapes.append(_stage_shape([part], pp_rank=0, rank=rank, stage_ids=(0,), has_last=True,
                                           blocks_attr=blocks_attr))
                continue
            c = resolved.config
            # The split first (parts as they are), the parallelization after, once per kind of stage.
            pipe = resolved.calls.pipeline(model, parallel_dims=dims, mesh=mesh, parallelism=c.parallelism,
                                           training=c.training, device=torch.device("meta"), loss_fn=_no_loss,
                                           parallelize=_unchanged)
            parts = list(pipe.model_parts)
            ids = tuple(getattr(pipe, "stage_ids", [pp_rank]))
            last = bool(getattr(pipe, "has_last_stage", pp_rank == dims.pp - 1))
            key = _structure(parts)
            known = built.get(key)
            if known is None:
                parts = [parallelize_part(resolved, p, mesh=mesh, tp_styles=styles) for p in parts]
                shape = _stage_shape(parts, pp_rank=pp_rank, rank=rank, stage_ids=ids, has_last=last,
                                     blocks_attr=blocks_attr)
                built[key] = shape
            else:
                stage_layers = _stage_layers(parts, blocks_attr)
                shape = replace(known, pp_rank=pp_rank, rank=rank, stage_ids=ids, has_last=last,
                                layer_names=tuple(n for names in stage_layers for n in names), stage_layers=stage_layers)
            shapes.append(shape)
    return shapes


def check_plannable(shard_ranks: int) -> None:
    """ConfigError for an FSDP2 shard group too large to set up here: torch's FSDP2 cuts every weight into one
    piece per shard rank when it is applied, on meta too (about 10 s and 0.8 GiB for 2,048 shard ranks of 70B,
    2 minutes and 4 GiB for 16,384), so a plan (or a rehearsal) over more would run for hours or out of memory."""
    if shard_ranks > MAX_PLANNED_SHARD_RANKS:
        raise ConfigError(
            f"this layout shards every weight over {shard_ranks:,} FSDP2 ranks (dp_shard x cp); setting that up "
            f"cuts each weight into that many pieces, which here can be planned up to {MAX_PLANNED_SHARD_RANKS:,} "
            f"(about 2 minutes and 4 GiB of memory). Large runs shard within a group and replicate across groups "
            f"(HSDP): set --parallelism.dp_replicate so that dp_shard x cp is {MAX_PLANNED_SHARD_RANKS:,} or fewer.")


def _unchanged(part: nn.Module) -> nn.Module:
    return part


def _structure(parts: list[nn.Module]) -> tuple[object, ...]:
    """What decides how a stage shards: its modules' types and parameter shapes, block numbers left out."""
    return tuple(
        (type(m).__name__, tuple((re.sub(r"\.\d+\.", ".#.", n), tuple(p.shape)) for n, p in m.named_parameters()),
         tuple(type(sub).__name__ for sub in m.modules()))
        for m in parts
    )


def _no_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return logits.sum()


# ---- the figures ----------------------------------------------------------------------------------------------


def micro_batch_size(resolved: ResolvedConfig) -> int:
    t, p = resolved.config.training, resolved.config.parallelism
    if not resolved.dims.pp_enabled:
        return t.local_batch_size
    n_mb = p.pp_microbatches or p.pp * p.pp_stages_per_rank
    return max(t.local_batch_size // n_mb, 1)


def in_flight(resolved: ResolvedConfig, pp_rank: int) -> int:
    """Stage-micro-batches whose activations a pipeline rank holds at its peak (1 without pipelining)."""
    p = resolved.config.parallelism
    pp = resolved.dims.pp
    if pp <= 1:
        return 1
    n_mb = p.pp_microbatches or pp * p.pp_stages_per_rank
    schedule = canonical_schedule(p.pp_schedule)
    if schedule == "GPipe":
        return n_mb
    if schedule in MULTI_STAGE_SCHEDULES:
        v = p.pp_stages_per_rank
        if schedule == "LoopedBFS":  # every forward of every stage before the first backward
            return n_mb * v
        per_round = n_mb // max(n_mb // pp, 1)
        return min(n_mb * v, (v - 1) * per_round + 2 * (pp - 1 - pp_rank) + 1)
    return min(pp - pp_rank, n_mb)  # 1F1B: the first stage holds pp micro-batches, the last one


def in_flight_stages(resolved: ResolvedConfig, pp_rank: int, local_stages: int) -> list[int]:
    """For each stage-micro-batch a pipeline rank holds at its peak, which of its stages (0 = its first) it
    belongs to. A multi-stage schedule warms up a round of micro-batches (pp of them) through its first stage,
    then the same round through its next, so a rank's activations at its peak are a mix of its stages' sizes,
    not every stage's layers per micro-batch."""
    count = in_flight(resolved, pp_rank)
    if local_stages <= 1:
        return [0] * count
    pp = resolved.dims.pp
    n_mb = resolved.config.parallelism.pp_microbatches or pp * local_stages
    per_round = n_mb // max(n_mb // pp, 1)
    return [(k // per_round) % local_stages for k in range(count)]


def in_flight_activations(resolved: ResolvedConfig, shape: StageShape, kept_per_stage: list[int]) -> int:
    """Bytes of saved activations a pipeline rank holds at its peak, given what one micro-batch of each of its
    stages keeps: from the schedule's own program where torch's schedule gives one (the multi-stage
    schedules), else from ``in_flight_stages``."""
    p = resolved.config.parallelism
    pp = resolved.dims.pp
    if pp > 1 and len(kept_per_stage) > 1 and len(shape.stage_ids) == len(kept_per_stage):
        n_mb = p.pp_microbatches or pp * len(kept_per_stage)
        program = schedule_program(canonical_schedule(p.pp_schedule), pp=pp, local_stages=len(kept_per_stage),
                                   microbatches=n_mb, rank=shape.pp_rank)
        if program is not None:
            return peak_in_flight_bytes(program, dict(zip(shape.stage_ids, kept_per_stage, strict=True)))
    return sum(kept_per_stage[i] for i in in_flight_stages(resolved, shape.pp_rank, len(kept_per_stage)))


def layer_activations(probe: ActivationProbe, names: tuple[str, ...], ac: ActivationCheckpointSection, *,
                      tp: int = 1, columnwise: frozenset[str] = frozenset(),
                      rowwise: frozenset[str] = frozenset()) -> tuple[int, int, int]:
    """Per rank: (bytes kept per micro-batch by these blocks, bytes of the largest block's recompute, bytes of
    the largest block's activation gradients while it is back-propagated) for the AC mode.

    Tensor parallelism (sequence-parallel between blocks) splits a block's activations over its tp ranks,
    except what it keeps whole: the inputs of the column-wise linears (gathered from the sequence shards
    for the matmul and saved so) and the outputs of the row-wise ones (full partial sums before their
    reduce-scatter, kept by per-op selective AC)."""
    kept = 0
    recompute = 0
    working = 0
    for name in names:
        block = probe.blocks.get(name)
        if block is None:
            continue
        whole_inputs = block.saved_inputs_of(columnwise) if tp > 1 else 0
        saved = _per_rank(block.saved, whole_inputs, tp)
        # The block being back-propagated frees its saved tensors as it makes their gradients: at its peak
        # two of its largest tensors' worth are live beyond what it saved (live bytes of CPU runs,
        # benchmarks/memory_plan.py). Under tensor parallelism the gathered input is whole.
        largest = max(block.largest_saved // tp, block.input_bytes) if tp > 1 else block.largest_saved
        working = max(working, 2 * largest)
        if ac.mode == "none":
            kept += saved
        elif ac.mode == "full" or (ac.mode == "selective" and ac.selective_every and _nth(name, ac.selective_every)):
            kept += block.input_bytes // tp
            recompute = max(recompute, saved)
        elif ac.mode == "selective" and ac.selective_every:
            kept += saved
        else:  # per-op selective: the input, the saved ops' outputs; the rest is recomputed
            whole_outputs = block.kept_outputs_of(rowwise) if tp > 1 else 0
            kept += _per_rank(min(block.input_bytes + block.selective_ops, block.saved), whole_outputs, tp)
            rest = max(block.saved - block.selective_ops, 0)
            recompute = max(recompute, _per_rank(rest, min(whole_inputs, rest), tp))
    return kept, recompute, working


def _per_rank(total: int, whole: int, tp: int) -> int:
    """One tp rank's bytes of ``total``, of which ``whole`` are not split."""
    whole = min(whole, total)
    return whole + (total - whole) // tp


def _nth(name: str, every: int) -> bool:
    return name.isdigit() and int(name) % every == 0


def plan_stage(resolved: ResolvedConfig, shape: StageShape, probe: ActivationProbe, *, device: TargetDevice | None,
               ac: ActivationCheckpointSection, compute_dtype: torch.dtype) -> StageMemory:
    c, dims = resolved.config, resolved.dims
    tp = dims.tp
    _, recompute, working = layer_activations(probe, shape.layer_names, ac, tp=tp, columnwise=shape.tp_columnwise,
                                              rowwise=shape.tp_rowwise)
    stages = shape.stage_layers or (shape.layer_names,)
    kept_per_stage = [layer_activations(probe, names, ac, tp=tp, columnwise=shape.tp_columnwise,
                                        rowwise=shape.tp_rowwise)[0] for names in stages]
    activ = in_flight_activations(resolved, shape, kept_per_stage) + recompute + working
    logits = 0
    if shape.has_last:
        elems = probe.logits_bytes // torch.empty((), dtype=compute_dtype).element_size()
        tokens = micro_batch_size(resolved) * local_seq_len(resolved)
        chunked = c.training.chunked_loss and resolved.calls.spec.build_loss_fn is None and not (
            dims.fsdp_enabled and c.parallelism.fsdp_reshard_after_forward == "always") and not splits_backward(
            c.parallelism)
        if chunked:
            # chunked_loss.py: one chunk's float32 logits, log-softmax and gradient at a time
            vocab_local = max(elems // max(tokens, 1) // tp, 1)
            rows = min(rows_per_chunk(vocab_local, c.training.loss_chunk_tokens), tokens)
            logits = 3 * 4 * rows * vocab_local
        else:
            # the logits (compute dtype), the loss's float32 copy of them and the float32 gradient
            logits = (probe.logits_bytes + 2 * 4 * elems) // tp
        logits += probe.outside // tp  # what the final norm and the head saved, live until their backward
    gather_size = torch.empty((), dtype=compute_dtype).element_size() if c.parallelism.param_dtype == "auto" else (
        2 if c.parallelism.param_dtype == "bfloat16" else 4)
    reduce_size = 2 if c.parallelism.reduce_dtype == "bfloat16" else 4
    fsdp = 0
    if dims.dp_cp > 1:
        blocks = sorted(shape.gather_blocks, reverse=True)
        biggest = sum(blocks[:2])
        policy = c.parallelism.fsdp_reshard_after_forward
        kept_gathered = sum(blocks) if (policy == "never" or (policy == "default" and dims.pp_enabled)) else biggest
        root = shape.gather_root if policy != "always" else 0
        # Under pipelining torch's stages turn gradient sync off until the last micro-batch's backward: the
        # stage's unsharded gradients add up over micro-batches, in the reduce dtype, for the whole step.
        unsharded_grads = sum(blocks) + shape.gather_root if dims.pp_enabled else biggest
        fsdp = (kept_gathered + root) * gather_size // 4 + unsharded_grads * reduce_size // 4
    pipe = 0
    if dims.pp_enabled:
        first = next((probe.blocks[n] for n in shape.layer_names if n in probe.blocks), None)
        pipe = 2 * (first.input_bytes if first is not None else 0) // tp  # one receive, one send buffer
    # [ema] keeps a float32 average of each weight beside the optimizer's state, sharded like it
    optim_bytes = OPTIMIZER_STATE_BYTES.get(c.optimizer.name, 8) + (4 if c.ema.decay is not None else 0)
    return StageMemory(
        pp_rank=shape.pp_rank, rank=shape.rank, stage_ids=shape.stage_ids, layers=len(shape.layer_names),
        local_params=shape.local_params, params=shape.param_bytes, grads=shape.local_params * 4,
        optim=shape.local_params * optim_bytes, activ=activ, logits=logits, fsdp=fsdp, pipe=pipe,
        runtime=RUNTIME_ALLOWANCE if device is not None and device.accelerator else 0,
        not_at_once=min(logits, recompute + working),
    )


def compute_dtype_for(resolved: ResolvedConfig, device: TargetDevice | None) -> torch.dtype:
    target = torch.device("cuda") if device is not None and device.accelerator else resolved.device
    return resolve_compute_dtype(resolved.config.training.dtype, target)


def probe_run(resolved: ResolvedConfig, model: nn.Module, *, device: TargetDevice | None,
              blocks_attr: str = "layers") -> ActivationProbe:
    """The activations of the run's micro-batch, from the meta model before converters swap its modules
    (a converter's modules need not run on meta; their activations are the plain model's here)."""
    return probe_activations(model, micro_batch=micro_batch_size(resolved), seq_len=local_seq_len(resolved),
                             dtype=compute_dtype_for(resolved, device), blocks_attr=blocks_attr)


def local_seq_len(resolved: ResolvedConfig) -> int:
    """The tokens of each sequence one rank holds: all of them, or 1/cp with context parallelism (whose
    attention keeps the same per-token tensors as a flash kernel: q, k, v, output and log-sum-exp)."""
    return resolved.config.training.seq_len // resolved.dims.cp


def make_plan(resolved: ResolvedConfig, model: nn.Module, *, device: TargetDevice | None,
              probe: ActivationProbe | None = None,
              blocks_attr: str = "layers") -> tuple[MemoryPlan, list[StageShape], ActivationProbe]:
    """The plan for the run's own settings (``model``: the meta model, converted, not yet parallelized;
    ``probe``: its activations, measured before the conversion)."""
    if probe is None:
        probe = probe_run(resolved, model, device=device, blocks_attr=blocks_attr)
    shapes = build_stage_shapes(resolved, model, blocks_attr=blocks_attr)
    plan = plan_from(resolved, shapes, probe, device=device, ac=resolved.config.activation_checkpoint)
    return plan, shapes, probe


def plan_from(resolved: ResolvedConfig, shapes: list[StageShape], probe: ActivationProbe, *,
              device: TargetDevice | None, ac: ActivationCheckpointSection) -> MemoryPlan:
    dtype = compute_dtype_for(resolved, device)
    stages = [plan_stage(resolved, s, probe, device=device, ac=ac, compute_dtype=dtype) for s in shapes]
    d = resolved.dims
    layout = f"pp {d.pp} x dp_replicate {d.dp_replicate} x dp_shard {d.dp_shard}{f' x cp {d.cp}' if d.cp > 1 else ''} x tp {d.tp}"
    if d.ep > 1:
        layout += f" (ep {d.ep})"
    t = resolved.config.training
    title = (f"memory plan: {d.world_size} rank{'s' if d.world_size != 1 else ''} ({layout}), local batch "
             f"{t.local_batch_size} x seq {t.seq_len}, micro-batch {micro_batch_size(resolved)}, AC {_ac_label(ac)}, "
             f"{str(dtype).removeprefix('torch.')} compute")
    notes: list[str] = []
    plan = MemoryPlan(title, stages, device, ac.mode, notes)
    peak = plan.peak
    if ac.mode == "none" and peak.activ > peak.total // 2:
        notes.append(f"warning: activation checkpointing is off and activations are {peak.activ / peak.total:.0%} "
                     f"of the peak rank's memory; --activation_checkpoint.mode=selective or full trades some "
                     f"recomputation for most of them")
    return plan


def _ac_label(ac: ActivationCheckpointSection) -> str:
    if ac.mode == "selective":
        return f"selective (every {ac.selective_every} blocks)" if ac.selective_every else "selective (per op)"
    return ac.mode


# ---- what helps when it does not fit ----------------------------------------------------------------------------


def advice(resolved: ResolvedConfig, plan: MemoryPlan, shapes: list[StageShape], probe: ActivationProbe) -> list[str]:
    """Settings that would bring the peak rank under the device's memory, each with its new peak."""
    device = plan.device
    if device is None or plan.fits():
        return []
    limit = device.memory_bytes
    ac = resolved.config.activation_checkpoint
    tips: list[str] = []
    for mode in ("selective", "full"):
        if mode == ac.mode and not (mode == "selective" and ac.selective_every):
            continue
        other = plan_from(resolved, shapes, probe, device=device, ac=ac.model_copy(update={"mode": mode,
                                                                                          "selective_every": 0}))
        tips.append(_tip(f"--activation_checkpoint.mode={mode}", other.peak.total, limit))
    peak = plan.peak
    lb = resolved.config.training.local_batch_size
    if lb > 1:
        per_sample = peak.activ + peak.logits + peak.pipe
        half = peak.total - per_sample + per_sample // 2
        tips.append(_tip(f"--training.local_batch_size={lb // 2} (training.global_batch_size keeps the global batch "
                         f"by accumulation)",
                         half, limit))
    states = peak.states
    tips.append(_tip(f"twice the ranks with --parallelism.dp_shard={resolved.dims.dp_shard * 2} (states halve)",
                     peak.total - states // 2, limit))
    cp = resolved.dims.cp * 2
    if supports_context_parallel(resolved.spec.model_cls) and resolved.config.training.seq_len % (2 * cp) == 0:
        # each rank holds half the tokens of every sequence (activations) and FSDP2 shards over cp too (states)
        sequence_part = peak.activ + peak.pipe + states
        tips.append(_tip(f"twice the context-parallel ranks, --parallelism.cp={cp} (a rank holds half of every "
                         f"sequence)", peak.total - sequence_part // 2, limit))
    if resolved.dims.pp < len(probe.blocks):
        stage_part = states + peak.fsdp + peak.activ
        tips.append(_tip(f"twice the pipeline stages, --parallelism.pp={resolved.dims.pp * 2} (a stage holds half "
                         f"the layers)", peak.total - stage_part // 2, limit))
    return tips


def _tip(setting: str, total: int, limit: int) -> str:
    verdict = "fits" if total <= limit else "still too big"
    return f"{setting}: about {total / GIB:,.1f} GiB ({verdict})"


# ---- the printed table ------------------------------------------------------------------------------------------


def format_plan(plan: MemoryPlan) -> str:
    lines = [plan.title]
    if plan.device is not None:
        lines.append(f"target device: {plan.device.name}, {plan.device.memory_gib:,.1f} GiB per rank")
    else:
        lines.append("target device: unknown (give --target-device NAME or SIZE to compare)")
    header = ["stage", "rank", "layers", "params(M)", *COLUMNS, "live", "total", "fits"]
    rows = [header]
    for s in plan.stages:
        fits = "-" if plan.device is None else ("yes" if s.total <= plan.device.memory_bytes else "NO")
        stage = ",".join(str(i) for i in s.stage_ids)
        rows.append([stage, str(s.rank), str(s.layers), f"{s.local_params / 1e6:,.1f}",
                     *(f"{getattr(s, c) / GIB:,.2f}" for c in COLUMNS), f"{s.live / GIB:,.2f}",
                     f"{s.total / GIB:,.2f}", fits])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines.append("per rank, GiB (params: this rank's share of the weights, in millions; live: the peak of live "
                 "tensors, the loss moment and the blocks' backward being apart; total: what the allocator holds)")
    lines += ["  ".join(cell.rjust(w) for cell, w in zip(r, widths)) for r in rows]
    peak = plan.peak
    summary = f"peak: {peak.total / GIB:,.2f} GiB on pipeline rank {peak.pp_rank} (global rank {peak.rank})"
    if plan.device is not None:
        share = peak.total / plan.device.memory_bytes
        summary += f", {share:.0%} of {plan.device.name}: {'fits' if plan.fits() else 'does NOT fit'}"
    lines.append(summary)
    lines += plan.notes
    return "\n".join(lines)


__all__ = ["MemoryPlan", "StageMemory", "advice", "format_plan", "in_flight", "in_flight_stages", "make_plan", "micro_batch_size",
           "plan_from"]

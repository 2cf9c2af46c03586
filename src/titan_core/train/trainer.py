"""The Trainer: the architecture page's init order, one method per step, and the loop.

The parts are built by the free functions of ``build.py`` (which ``--dry-run`` and the
launcher's preflight call too); the Trainer holds them and runs the loop. Subclass it and
replace one method (``compute_loss``, ``build_model``, ``forward_backward``, ...) to change
one step without copying the loop, and run the subclass with ``titan-train --trainer
pkg.module:MyTrainer`` (docs/custom-trainer.md).
"""

from __future__ import annotations

import contextlib
import math
import time
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from ..boundary.plugin_boundary import SpecCalls, converter_calls
from ..checkpoint import CheckpointManager, RunIdentity, collect_param_shapes, export_safetensors, training_states
from ..checkpoint.stateful import EMA, Stateful, progress_state
from ..config.job import JobConfig, accumulation_steps
from ..config.parallel_dims import ParallelDims
from ..config.toml_out import dumps
from ..console import progress, say
from ..data import build_dataloader, build_mixture_loader
from ..data.describe import describe_data
from ..data.documents import accepts_positions, split_documents
from ..data.identity import data_identity
from ..data.masking_check import check_targets_under_masking
from ..data.mixture import source_tokens
from ..data.prefetch import PrefetchingLoader
from ..data.token_ids import check_batch_ids
from ..errors import ConfigError, NonFiniteError
from ..hf.export import export_hf
from ..models.attention_logits import Adjust, AttentionLogits, attention_logits
from ..models.loss import cross_entropy_loss
from ..models.loss_terms import LABELS_KWARG, forward_declares
from ..models.model_parts import HeadRequest, hidden_states_for_loss
from ..models.ties import check_ties, retie_weights
from ..moe import MoEMonitor
from ..observability.metrics import MetricsLogger, reset_peak_memory
from ..observability.profiling import StepProfiler
from ..observability.report import report_at_end
from ..optim.param_groups import run_layout
from ..parallel import check_expert_parallel, check_expert_tensor_parallel, check_experts_split, distributed
from ..parallel.context_parallel import (
    ContextParallel,
    check_sharded_over_cp,
    prepare_model as prepare_context_parallel_model,
)
from ..parallel.expert_tensor_parallel import check_etp_fits
from ..parallel.parameter_layout import describe_parameter_layout
from ..parallel.pipeline import splits_backward, step_schedule
from ..parallel.precision import autocast_for, resolve_compute_dtype
from ..plan.resolve import ResolvedConfig
from ..plugin.protocols import ModelConverter, TensorParallelStyles, Tokenizer, TrainSpec
from ..plugin.spec_factories import LossFn, LRSchedulers, MetricsProcessor, Pipeline
from ..runtime.cpu_allocator import keep_freed_memory_in_heap, release_freed_memory
from ..runtime.cpu_threads import choose_cpu_threads
from ..runtime.determinism import enable_deterministic
from ..runtime.launch_env import rank_env
from ..runtime.out_of_memory import out_of_memory_named
from ..runtime.run_files import atomic_write_text, require_writable, supersede_metrics
from ..runtime.signals import no_interrupt, sigterm_stops_at_once
from ..runtime.torch_compat import pipeline_grad_divisor
from ..weights.load import load_starting_weights
from ..weights.shape import check_shape_file_unchanged, record_shape_file
from . import build
from .chunked_loss import chunkable_head, chunked_cross_entropy_and_z
from .converters import ConversionTable, check_converted_modules_learn
from .ema import WeightAverage
from .evaluation import TrainingEvaluation, build_training_evaluation, run_training_evaluation
from .finite_watch import FiniteWatch
from .grad_norm import clip_grad_norm_on_device, scale_gradients
from .layer_stats import LayerStats, StepMeasurement, blocks_of
from .model_loss_terms import LossTermCollector
from .qk_clip import QKClip, reshard
from .spike_guard import SPIKE_GUARD, SpikeGuard
from .stop_on_signal import stop_after_signal
from .stop_vote import StopVote
from .token_loss import count_valid, global_token_mean, global_valid_tokens, token_loss_sum, token_weighted
from .tp_styles import resolve_tp_styles
from .z_loss import ZLoss

# A micro-batch as the step runs it: inputs, labels, and the document positions (data.document_masking).
MicroBatch = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]


@dataclass
class StepResult:
    # Tensors stay on the device until a logging step reads them (finite_watch.py); floats where read.
    loss: torch.Tensor | float
    grad_norm: torch.Tensor | float
    skipped: bool
    spiked: bool = False  # skipped by the loss-spike guard (spike_guard.py)
    rolls_back: bool = False  # the spike that makes spike_rollback spikes in a row


# Steps whose loss tensors are kept on the device before being read into floats (one host sync per batch).
LOSS_BATCH = 256


def to_device(batch: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A loader's CPU tensor on ``device``; to CUDA through pinned memory without blocking the host
    (the copy is queued before the step's kernels, so they see it complete)."""
    if device.type != "cuda":
        return batch.to(device)
    return batch.pin_memory().to(device, non_blocking=True)


def _plain(loss: torch.Tensor) -> torch.Tensor:
    """A detached plain tensor (a loss on vocab-sharded logits is a replicated DTensor)."""
    from torch.distributed.tensor import DTensor

    loss = loss.detach()
    return loss.full_tensor() if isinstance(loss, DTensor) else loss


class Trainer:
    """Builds every component from a validated config, then trains.

    Its state is declared below, typed, grouped by the method of ``setup`` that sets it. The
    Trainer is also the checkpoint's ``progress`` state (``state_dict``: step and tokens seen).
    """

    # from the resolved config (__init__)
    resolved: ResolvedConfig
    config: JobConfig
    spec: TrainSpec
    calls: SpecCalls  # every call into the spec's code, guarded and checked (plugin_boundary.py)
    converter_classes: list[tuple[str, type[ModelConverter[Any]]]]
    dims: ParallelDims
    device: torch.device
    run_dir: Path
    # progress (the checkpoint's "progress" state: step and tokens_seen)
    step: int
    tokens_seen: int
    skipped_steps: int
    finite_watch: FiniteWatch  # the first unread non-finite step, kept on the device
    step_valid_tokens: int | torch.Tensor  # valid labels of the step over all data-parallel ranks (on the device)
    pp_batch_rows: int  # rows of the micro-batch the pipeline schedule is running
    pp_schedule_steps: int  # pipeline schedule steps run so far in this optimizer step (accumulation)
    # init_distributed
    is_rank0: bool
    proc: distributed.ProcessInfo
    mesh: Any  # DeviceMesh, or None in a single-process run
    dp_flat_mesh: Any  # the flattened data-parallel DeviceMesh, or None
    dp_rank: int
    compute_dtype: torch.dtype
    # build_tokenizer_and_data
    tokenizer: Tokenizer
    dataloader: PrefetchingLoader
    val_dataloader: Any  # a DataLoader, or None without validation
    evaluation: TrainingEvaluation  # [eval]: the tasks, read and tokenized (evaluation.py)
    # build_model, apply_converters
    model_args: Any
    ties: list[tuple[str, str]]
    n_params: int
    converters: list[ModelConverter[Any]]
    conversion_table: ConversionTable
    # build_model_parts, materialize_and_init
    loss_fn: LossFn
    accum: int
    pipeline: Pipeline | None
    model_parts: list[nn.Module]
    moe: MoEMonitor
    loss_terms: LossTermCollector
    # build_optimizers, build_checkpointer, build_metrics, build_profiler
    optimizer: torch.optim.Optimizer
    lr_schedulers: LRSchedulers
    checkpointer: CheckpointManager
    ema: WeightAverage | None  # [ema]: the moving average of the weights (ema.py); swapped_in() for an evaluation
    z_loss: ZLoss  # [stability] z_loss (z_loss.py): in each micro-batch's gradient, logged on logging steps
    spike_guard: SpikeGuard | None  # [stability] spike_guard (spike_guard.py): its window is checkpointed
    metrics: MetricsProcessor
    layer_stats: LayerStats | None  # metrics.layer_stats (layer_stats.py): measures logging steps only
    layer_figures: dict[str, float]  # the last measured step's ``layer/*`` (and ``qk_clip/*``) figures, until logged
    qk_clip: QKClip | None  # [stability] qk_clip_threshold (qk_clip.py): rescales heads after each step
    last_micro_batch: MicroBatch  # the step's last micro-batch, which QK-clip measures again after the update
    profiler: StepProfiler

    def __init__(self, resolved: ResolvedConfig) -> None:
        self.resolved = resolved
        self.config: JobConfig = resolved.config
        self.spec = resolved.spec
        self.converter_classes = resolved.converters
        self.calls = resolved.calls  # every call into the spec's code goes through this checked facade
        # Derived once by resolve_config (parallel degrees, device, backend, model args).
        self.dims: ParallelDims = resolved.dims
        self.device: torch.device = resolved.device
        self.is_rank0 = rank_env()[0] == 0  # init_distributed confirms it from the process group
        self.step = 0
        self.gradients_checked = False  # after this process's first backward (check_converted_modules_learn)
        self.started_at_step = 0  # the step this run started from (set again after a resume)
        self.step_valid_tokens = 0
        self.pp_batch_rows = 0
        self.pp_schedule_steps = 0
        self.tokens_seen = 0
        self.skipped_steps = 0
        self.ema = None  # build_checkpointer makes it when [ema] sets a decay
        self.finite_watch = FiniteWatch(self.device)
        self.z_loss = ZLoss(self.config.stability.z_loss, self.device)
        self.spike_guard = SpikeGuard.from_config(self.config.stability)
        self.run_dir = Path(self.config.job.run_dir)

    # ---- set-up, in the architecture page's order -------------------------------------------
    def setup(self) -> None:
        self.init_distributed()
        self.build_tokenizer_and_data()
        self.build_evaluation()
        model = self.build_model()
        self.apply_converters(model)
        self.build_model_parts(model)
        self.materialize_and_init()
        self.build_optimizers()
        self.build_checkpointer()
        self.build_metrics()
        self.build_profiler()

    def init_distributed(self) -> None:
        t, p = self.config.training, self.config.parallelism
        if self.device.type == "cpu" and t.cpu_malloc_tuning:  # before the process group starts its threads
            keep_freed_memory_in_heap()
        self.proc = distributed.init_process_group(backend=self.resolved.backend, device=self.device,
                                                   init_timeout_s=p.init_timeout_s,
                                                   collective_timeout_s=p.collective_timeout_s)
        if self.proc.world_size != self.dims.world_size:
            raise ConfigError(f"the config was resolved for {self.dims.world_size} process(es) but this run has "
                              f"{self.proc.world_size}; resolve it with world_size={self.proc.world_size}.")
        self.mesh, self.dp_flat_mesh = self.dims.build_meshes(self.device.type) if self.dims.distributed else (None, None)
        self.dp_rank = self.dp_flat_mesh.get_local_rank() if self.dp_flat_mesh is not None else 0
        # The ranks whose tokens differ (data-parallel, with context-parallel folded in): token counts add up over it.
        self.token_mesh = self.dims.token_mesh(self.mesh, self.dp_flat_mesh) if self.dims.distributed else None
        self.context_parallel = None
        self.passes_positions = accepts_positions(self.spec.model_cls) and (
            not self.dims.pp_enabled or self.spec.pipeline_takes_positions)
        # Labels reach a model that declares them only where one forward holds whole sequences (loss_terms.py).
        self.passes_labels = (forward_declares(self.spec.model_cls, LABELS_KWARG) and not self.dims.pp_enabled
                              and not self.dims.cp_enabled)
        if self.dims.cp_enabled:
            self.context_parallel = ContextParallel(group=self.mesh["cp"].get_group(), seq_len=t.seq_len,
                                                    load_balance=p.cp_load_balance,
                                                    document_masking=self.config.data.document_masking)
        torch.manual_seed(t.seed)
        if t.deterministic:
            progress(enable_deterministic(), is_rank0=rank_env()[0] == 0)
        self.compute_dtype = resolve_compute_dtype(t.dtype, self.device)
        if self.proc.is_rank0:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        self.is_rank0 = self.proc.is_rank0
        n = self.proc.world_size
        dtype = str(self.compute_dtype).removeprefix("torch.")
        precision = dtype if self.compute_dtype == torch.float32 else f"{dtype} autocast over float32 weights"
        threads = f", {choose_cpu_threads()}" if self.device.type == "cpu" else ""
        progress(f"device {self.device}, {n} process{'es' if n > 1 else ''}, {precision}{threads}", is_rank0=self.is_rank0)

    def build_tokenizer_and_data(self) -> None:
        d, t = self.config.data, self.config.training
        progress(f"loading tokenizer ({d.tokenizer}) and data ({describe_data(d)})", is_rank0=self.is_rank0)
        self.tokenizer = self.resolved.tokenizer

        dp_rank, dp_world_size = self.data_shard()

        def loader(split: Literal["train", "validation"]) -> Any:
            common: dict[str, Any] = dict(
                tokenizer=self.tokenizer, seq_len=t.seq_len, local_batch_size=t.local_batch_size,
                dp_rank=dp_rank, dp_world_size=dp_world_size, seed=t.seed, split=split,
                val_fraction=d.val_fraction, text_field=d.text_field, hf_split=d.hf_split,
                allow_download=d.allow_download,
            )
            if d.mix:  # a weighted mixture replaces data.source (docs/data.md)
                return build_mixture_loader(mix={n: (m.source, m.weight) for n, m in d.mix.items()}, **common)
            spec_loader = self.calls.dataloader(source=d.source, **common)
            return build_dataloader(source=d.source, **common) if spec_loader is None else spec_loader

        train = loader("train")
        self.val_dataloader = loader("validation") if self.config.validation.enable else None
        if d.document_masking:  # data of end-of-document tokens only would train at loss 0
            mix = {n: m.source for n, m in d.mix.items()}
            for split, built in (("train", train), ("validation", self.val_dataloader)):
                check_targets_under_masking(built, split=split, source=d.source, mix=mix,
                                            eos_id=self.tokenizer.eos_id, bos_id=self.tokenizer.bos_id)
        # The next batches are made in a thread while the step runs; its state is that of the consumed batches.
        self.dataloader = PrefetchingLoader(train)

    def build_evaluation(self) -> None:
        self.evaluation = build_training_evaluation(self)

    @contextlib.contextmanager
    def evaluation_weights(self) -> Iterator[list[nn.Module]]:
        """The model parts ``[eval]`` scores, for the duration of one evaluation: the trained weights, or with
        ``eval.weights=ema`` the EMA swapped in and back out. A subclass may yield other weights here."""
        if self.config.eval.weights == "ema" and self.ema is not None:
            with self.ema.swapped_in():
                yield self.model_parts
        else:
            yield self.model_parts

    def maybe_evaluate(self, *, last: bool) -> None:
        if self.evaluation.due(self.step, last=last):
            run_training_evaluation(self, self.evaluation)

    def data_shard(self) -> tuple[int, int]:
        """(this rank's share, number of shares) of each global batch (fault tolerance adds replica groups)."""
        return self.dp_rank, self.dims.dp

    def build_model(self) -> nn.Module:
        self.model_args = self.resolved.model_args  # the flavor's, or config.json's with initial_load
        if self.resolved.model_shape_note:
            progress(self.resolved.model_shape_note, is_rank0=self.is_rank0)
        built = build.build_meta_model(self.resolved)
        self.ties, self.n_params = built.ties, built.n_params
        build.announce_model(self.resolved, built.n_params, is_rank0=self.is_rank0)
        build.check_fits(self.resolved, built.n_params)
        return built.model

    def build_converters(self) -> list[tuple[str, ModelConverter[Any]]]:
        """The requested converters, constructed, with their names."""
        named = build.build_converters(self.resolved)
        self.converters = [conv for _, conv in named]
        return named

    def named_converters(self) -> list[tuple[str, ModelConverter[Any]]]:
        return [(name, conv) for (name, _), conv in zip(self.converter_classes, self.converters)]

    def apply_converters(self, model: nn.Module) -> None:
        named = self.build_converters()
        self.conversion_table = build.convert_model(self.resolved, model, named)
        if self.is_rank0 and named:
            if self.config.metrics.conversion_table == "full":
                print(self.conversion_table.format(), flush=True)
            else:  # the table has a row per module (42 for a small float8 model): one line, the rows in the run folder
                print(f"[titan] {self.conversion_table.summary()}; every row: conversion_table.json in the run "
                      "folder (--metrics.conversion_table=full prints them)", flush=True)

    def tp_styles(self) -> TensorParallelStyles:
        return resolve_tp_styles([(c.name, c) for c in converter_calls(self.named_converters())])  # guarded

    def parallelize(self, part: nn.Module) -> nn.Module:
        return build.parallelize_part(self.resolved, part, mesh=self.mesh, tp_styles=self.tp_styles())

    def build_model_parts(self, model: nn.Module) -> None:
        self.loss_fn = self.calls.loss_fn() or cross_entropy_loss
        t, p = self.config.training, self.config.parallelism
        if self.context_parallel is not None:  # on the meta model, before parallelize_fn and pipelining_fn
            prepare_context_parallel_model(model, spec_name=self.spec.name, cp=self.dims.cp)
        # The chunked loss stands in for the built-in one only; with FSDP's reshard-always the
        # head's weight is sharded again once the forward returns, so the head stays in the forward.
        self.chunk_loss = (t.chunked_loss and self.loss_fn is cross_entropy_loss
                           and type(self).compute_loss is Trainer.compute_loss
                           and not (self.dims.fsdp_enabled and p.fsdp_reshard_after_forward == "always")
                           and not splits_backward(p))
        if t.chunked_loss and splits_backward(p):
            progress(f"chunked loss off: the {p.pp_schedule} schedule runs each backward in two passes, and the "
                     f"chunked loss hands its gradients back once; the full logits are held instead",
                     is_rank0=self.is_rank0)
        self.pipe_head: HeadRequest | None = None  # the request of the pipeline step under way
        self.accum = accumulation_steps(self.config, self.dims.dp)
        self.pipeline = None
        if self.dims.pp_enabled:
            if self.dims.ep_enabled:  # the whole model has experts for EP (a stage may hold dense layers only)
                check_experts_split(model, self.dims.ep, what=f"spec {self.spec.name}")
            if p.etp > 1:  # and for ETP
                check_etp_fits(model, p.etp, what=f"spec {self.spec.name}")
            self.pipeline = self.calls.pipeline(
                model, parallel_dims=self.dims, mesh=self.mesh, parallelism=self.resolved.plugin_parallelism,
                training=self.config.training, device=self.device, loss_fn=self.scaled_loss, parallelize=self.parallelize,
                added={"precision": self.resolved.precision},  # plugin API 1.1, to functions naming it
            )
            self.model_parts = self.pipeline.model_parts
            if self.context_parallel is not None:
                self.context_parallel.follow_micro_batches(self.model_parts)
        else:
            self.model_parts = [self.parallelize(model)]
        check_ties(self.model_parts, self.ties, after="parallelize_fn")
        if self.context_parallel is not None:
            check_sharded_over_cp(self.model_parts, self.context_parallel.group, spec_name=self.spec.name)
        check_expert_parallel(self.model_parts, self.dims, what=f"spec {self.spec.name}")
        check_expert_tensor_parallel(self.model_parts, self.config.parallelism.etp, what=f"spec {self.spec.name}")

        # A no-op for a model without MoE blocks. Loads add up over the data-parallel ranks only:
        # other pipeline ranks hold other layers; tp ranks route the same tokens (cp ranks other ones).
        # Pipeline stages join their auxiliary losses to backward through their outputs, weighted as
        # forward_backward weights them (the schedule then divides by its micro-batch count, as the loss).
        self.moe = MoEMonitor(self.model_parts, group=self.token_group() if self.dims.distributed else None,
                              stage_group=self.mesh["pp"].get_group() if self.dims.pp_enabled else None,
                              aux_loss_in_backward=1.0 / self.accum if self.pipeline is not None else None,
                              sequence_group=self.context_parallel.group if self.context_parallel else None)
        # The terms a model adds to its own loss (models/loss_terms.py): none for most models.
        self.loss_terms = LossTermCollector(self.model_parts, device=self.device,
                                            group=self.token_group() if self.dims.distributed else None)
        if self.dims.distributed:
            self.report_layout()

    def token_group(self) -> Any:
        """The process group of the ranks whose tokens differ (data-parallel x context-parallel)."""
        assert self.token_mesh is not None  # asked only of a multi-process run, which has one
        return self.token_mesh.get_group()

    def report_layout(self) -> None:
        """Log where the parameters really ended up (read from the model, not the config)."""
        tp = ""
        if self.dims.tp_enabled:
            styles = self.tp_styles()
            tp = f"; tensor-parallel styles {styles.colwise.__name__} / {styles.rowwise.__name__}"
        progress(f"parameters: {describe_parameter_layout(self.model_parts)}{tp}", is_rank0=self.is_rank0)
        if self.config.compile.enable:  # what the parallelize_fn compiled (whole blocks, or parts of them)
            compiled = [m for part in self.model_parts for m in part.modules()
                        if getattr(m, "_compiled_call_impl", None) is not None]
            names = sorted({type(m).__name__ for m in compiled})
            progress(f"compiled: {len(compiled)} modules ({', '.join(names)})", is_rank0=self.is_rank0)

    def scaled_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The pipeline's per-microbatch loss, weighted by its share of the step's valid tokens;
        the schedule divides gradients by its number of microbatches, hence ``splits``.
        Validation runs the schedule forward-only under no_grad: there the sum of its token losses."""
        valid = count_valid(labels)
        loss = self.micro_batch_loss(logits, labels, self.pipe_head, valid=valid)
        if not torch.is_grad_enabled():
            return token_loss_sum(loss, valid=valid)
        return token_weighted(loss, valid=valid, global_valid=self.step_valid_tokens, dp=self.dims.dp_cp,
                              splits=self.pp_batch_rows // labels.shape[0])

    def materialize_and_init(self) -> None:
        for part in self.model_parts:
            part.to_empty(device=self.device)
            retie_weights(part, self.ties)  # to_empty makes a new parameter per module
            # With checkpoint.initial_load every parameter is loaded next: only buffers are computed.
            self.calls.init_weights(part, seed=self.config.training.seed,
                                    buffers_only=bool(self.config.checkpoint.initial_load))
            part.train()
        check_ties(self.model_parts, self.ties, after="to_empty and init")

    def build_optimizers(self) -> None:
        self.optimizer, self.lr_schedulers = build.build_optimizers(self.resolved, self.model_parts,
                                                                    self.named_converters())

    def build_checkpointer(self) -> None:
        c = self.config
        identity = RunIdentity(
            spec=self.spec.name, flavor=c.model.flavor, converters=tuple(c.model.converters),
            param_shapes=collect_param_shapes(self.model_parts),  # all pipeline stages' parameters
            param_groups=None if self.spec.build_optimizers_fn else run_layout(self.model_parts, c.optimizer),
            data=data_identity(self.dataloader),
        )
        states = training_states(self.model_parts, self.optimizer, lr_schedulers=self.lr_schedulers,
                                 dataloader=self.dataloader, progress=self)
        self.ema = WeightAverage.from_config(c.ema, self.model_parts)
        if self.ema is not None:
            states[EMA] = self.ema.state()
        if self.spike_guard is not None:
            states[SPIKE_GUARD] = self.spike_guard
        states.update(self.extra_states())
        self.checkpointer = CheckpointManager(config=c.checkpoint, run_dir=self.run_dir, states=states,
                                              identity=identity, is_rank0=self.is_rank0,
                                              lone_rank=self.checkpoint_lone_rank())

    def checkpoint_lone_rank(self) -> tuple[int, int] | None:
        """(rank, world size) when this process saves alone, as one rank of a layout whose other ranks do not
        exist (rehearsal); None when every rank of the process group takes part in a save."""
        return None

    def extra_states(self) -> dict[str, Stateful]:
        """Named states a subclass adds to its checkpoints (e.g. DiLoCo's outer optimizer)."""
        return {}

    # The Trainer is the checkpoint's ``progress`` state: the step and the tokens seen.
    def state_dict(self) -> dict[str, Any]:
        return progress_state(self.step, self.tokens_seen)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.step, self.tokens_seen = int(state_dict["step"]), int(state_dict["tokens_seen"])

    def build_metrics(self) -> None:
        fpt = self.calls.flops_per_token(self.model_args, self.config.training.seq_len)
        options: dict[str, Any] = dict(
            run_dir=self.run_dir, is_rank0=self.is_rank0, device=self.device, flops_per_token=fpt,
            world_size=self.proc.world_size, run_config=self.config.model_dump(mode="json"),
        )
        metrics = self.calls.metrics(self.config.metrics, **options)
        self.metrics = MetricsLogger(self.config.metrics, **options) if metrics is None else metrics
        self.layer_figures = {}
        self.layer_stats = None
        if self.config.metrics.layer_stats:
            self.layer_stats = LayerStats(self.model_parts, distributed=self.dims.distributed,
                                          stage_ranks=self.dims.world_size // self.dims.pp)
        self.qk_clip = None
        if self.config.stability.qk_clip_threshold:
            owner = {id(m): name for name, block in blocks_of(self.model_parts).items() for m in block.modules()}
            self.qk_clip = QKClip(self.config.stability.qk_clip_threshold, model_parts=self.model_parts,
                                  layer_of=lambda m: owner.get(id(m)),
                                  dp_group=self.dp_flat_mesh.get_group() if self.dims.dp > 1 else None,
                                  tp_group=self.mesh["tp"].get_group() if self.dims.tp_enabled else None)

    def build_profiler(self) -> None:
        self.profiler = StepProfiler(self.config.profiling, run_dir=self.run_dir, rank=self.proc.rank,
                                     device=self.device, is_rank0=self.is_rank0)

    # ---- one step ------------------------------------------------------------------------------
    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return autocast_for(self.device, self.compute_dtype)

    def loss_context(self) -> contextlib.AbstractContextManager[Any]:
        """Loss on vocab-sharded logits needs torch's loss_parallel context (TP only)."""
        if self.dims.tp_enabled and self.config.parallelism.loss_parallel:
            from torch.distributed.tensor.parallel import loss_parallel

            return loss_parallel()
        return contextlib.nullcontext()

    def prepare_batch(self, inputs: torch.Tensor, labels: torch.Tensor) -> MicroBatch:
        """With data.document_masking: each token's position in its document, and the labels
        that cross a document boundary ignored (data/documents.py). With context parallelism: this
        rank's chunks of the sequences (parallel/context_parallel.py)."""
        positions = None
        if self.config.data.document_masking:
            positions, labels = split_documents(inputs, labels, eos_id=self.tokenizer.eos_id,
                                                bos_id=self.tokenizer.bos_id)
        if self.context_parallel is not None:  # this rank's chunks of every sequence, with their positions
            return self.context_parallel.shard_batch(inputs, labels, positions)
        return inputs, labels, positions

    def count_step_tokens(self, micro_batches: list[MicroBatch]) -> int | torch.Tensor:
        """Valid labels of this step on every data-parallel (and context-parallel) rank (one all-reduce; TP/PP
        ranks share data)."""
        local = sum(count_valid(labels) for _, labels, _ in micro_batches)
        group = self.token_group() if self.dims.dp_cp > 1 else None
        return global_valid_tokens(local, group=group, device=self.device)

    def compute_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The mean loss of one micro-batch (the spec's ``build_loss_fn``, or cross-entropy)."""
        return self.loss_fn(logits, labels)

    def head_request(self) -> contextlib.AbstractContextManager[HeadRequest | None]:
        """Around a forward: asks a model that ends in ``final_norm_and_head`` for its hidden states
        and head, when the loss is chunked (chunked_loss.py)."""
        return hidden_states_for_loss() if self.chunk_loss else contextlib.nullcontext(None)

    def micro_batch_loss(self, output: torch.Tensor, labels: torch.Tensor, request: HeadRequest | None, *,
                         valid: int) -> torch.Tensor:
        """The mean loss of one micro-batch from the forward's ``output``: logits, or the final hidden
        states when the forward handed its head over in ``request``."""
        head = request.head if request is not None else None
        if head is None:  # with [stability] z_loss, its gradient joins the loss's (the value stays the loss)
            return self.z_loss.fold(self.compute_loss(output, labels), output, labels, valid=valid)
        if chunkable_head(head):
            loss, z_sum = chunked_cross_entropy_and_z(output, head, labels, valid=valid, z_coeff=self.z_loss.coeff,
                                                      chunk_tokens=self.config.training.loss_chunk_tokens)
            self.z_loss.record(z_sum)
            return loss
        logits = head(output)
        return self.z_loss.fold(self.compute_loss(logits, labels), logits, labels, valid=valid)

    def sequence_attention(self, positions: torch.Tensor | None) -> contextlib.AbstractContextManager[Any]:
        """Around a forward and its backward: with context parallelism, attention across the cp ranks."""
        if self.context_parallel is None or positions is None:
            return contextlib.nullcontext()
        return self.context_parallel.attention(positions)

    def model_kwargs(self, positions: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """``positions=`` for a model (or pipeline) that takes them: with document masking (checked up front), and
        under context parallelism, where they are each token's place in the whole sequence. A model without the
        parameter runs context-parallel too, when it encodes no positions (as the plugin scaffold's)."""
        if positions is None or not self.passes_positions:
            return {}
        return {"positions": to_device(positions, self.device)}

    def declared_vocab(self) -> int | None:
        """The vocabulary the model's args declare (the least width of its logits), or None."""
        vocab = getattr(self.model_args, "vocab_size", None)
        return vocab if isinstance(vocab, int) else None

    def forward_backward(self, inputs: torch.Tensor, labels: torch.Tensor,
                         positions: torch.Tensor | None = None) -> torch.Tensor:
        """One micro-batch; returns its loss weighted by its share of the step's valid tokens
        (token_loss.py), zero on non-last PP stages."""
        check_batch_ids(inputs, self.model_args, self.tokenizer)  # the tokenizer's fault, not the model's
        valid = count_valid(labels)  # before the copy to the device: no sync
        inputs, labels = to_device(inputs, self.device), to_device(labels, self.device)
        if self.pipeline is not None:
            return self.pipeline_forward_backward(inputs, labels, positions)
        with self.autocast(), self.loss_context(), self.sequence_attention(positions):
            with self.profiler.phase("forward"), self.head_request() as request:
                labelled = {LABELS_KWARG: labels} if self.passes_labels else {}
                output = self.calls.forward(self.model_parts[0], inputs, vocab=self.declared_vocab(),
                                            **self.model_kwargs(positions), **labelled)
            if self.context_parallel is not None:
                self.context_parallel.check_redirected(spec_name=self.spec.name)
            loss = token_weighted(self.micro_batch_loss(output, labels, request, valid=valid), valid=valid,
                                  global_valid=self.step_valid_tokens, dp=self.dims.dp_cp)
            # The MoE load-balancing loss and the model's own terms: trained on, not reported in `loss`.
            extra = [t for t in (self.moe.after_forward(), self.loss_terms.after_forward()) if t is not None]
            with self.profiler.phase("backward"):
                # One backward from both roots: under TP's loss parallelism the loss is a DTensor and the extra
                # terms plain tensors, and a sum of the two would hand the plain branch a DTensor gradient.
                torch.autograd.backward([loss, *(term / self.accum for term in extra)])
        return _plain(loss)

    def pipeline_forward_backward(self, inputs: torch.Tensor, labels: torch.Tensor,
                                  positions: torch.Tensor | None = None) -> torch.Tensor:
        pipe = self.pipeline
        assert pipe is not None  # called only when build_model_parts built a pipeline
        losses: list[torch.Tensor] | None = [] if pipe.has_last_stage else None
        target = labels if pipe.has_last_stage else None
        self.pp_batch_rows = labels.shape[0]
        args = (inputs,) if pipe.has_first_stage else ()
        # Keyword arguments reach every stage (split into microbatches like the inputs): the
        # document positions travel beside the activations (TrainSpec.pipeline_takes_positions).
        z_mark = self.z_loss.mark()
        # Each schedule step ends by dividing every gradient of its stages by its microbatch count, the
        # gradients earlier accumulation micro-batches left too: they are multiplied by it first, so that
        # each micro-batch's gradients are divided once (exactly, for a power-of-two count).
        if self.pp_schedule_steps:
            scale_gradients(self.model_parts, pipeline_grad_divisor(pipe.schedule))
        self.pp_schedule_steps += 1
        with self.autocast(), self.loss_context(), self.head_request() as self.pipe_head, \
                self.sequence_attention(positions):
            step_schedule(pipe.schedule, *args, target=target, losses=losses, **self.model_kwargs(positions))
        self.pipe_head = None
        self.z_loss.keep_last_since(z_mark, len(losses or ()))  # the schedule's losses only (z_loss.py)
        if losses:
            return torch.stack([_plain(loss) for loss in losses]).mean()
        return torch.zeros((), device=self.device)

    def train_step(self, batches: Iterator[tuple[torch.Tensor, torch.Tensor]]) -> StepResult:
        measuring = self.measures_layers_at(self.step + 1)
        measure = self.layer_stats.open() if measuring and self.layer_stats is not None else None
        try:
            return self.train_step_measured(batches, measure)
        finally:
            if measure is not None:
                measure.close()  # the hooks never outlive the step, whatever happened in it

    def measures_layers_at(self, step: int) -> bool:
        """Whether ``step`` measures the per-block statistics: the logging steps, with metrics.layer_stats."""
        return self.layer_stats is not None and self.metrics.should_log(step, last=step == self.config.training.steps)

    def train_step_measured(self, batches: Iterator[tuple[torch.Tensor, torch.Tensor]],
                            measure: StepMeasurement | None) -> StepResult:
        self.optimizer.zero_grad()
        loss = self.step_forward_backward(batches)
        if not self.gradients_checked:
            check_converted_modules_learn(self.model_parts, self.conversion_table)
            self.gradients_checked = True
        if measure is not None:
            measure.after_backward()  # the gradients before clipping
        pp_group = self.mesh["pp"].get_group() if self.dims.pp_enabled else None
        grad_norm = clip_grad_norm_on_device(self.model_parts, self.config.training.max_norm, pp_group=pp_group)
        global_loss = self.global_loss_on_device(loss)
        refused = self.check_finite(global_loss, grad_norm)
        if refused is not None:
            return refused
        if measure is not None:
            measure.before_update()
        with self.profiler.phase("optimizer"):
            self.optimizer.step()
        if measure is not None:
            self.layer_figures = measure.after_update()
        if self.qk_clip is not None:
            clipped = self.qk_clip.after_step(self.measure_attention_logits)
            if self.metrics.should_log(self.step + 1, last=self.step + 1 == self.config.training.steps):
                self.layer_figures = {**self.layer_figures, **clipped}
        self.moe.after_step(read=False)  # MoE bias update; its figures stay on the device until logged
        self.loss_terms.after_step()
        self.lr_schedulers.step()
        return StepResult(global_loss, grad_norm, skipped=False)

    def reads_loss_at(self, step: int) -> bool:
        """Whether ``step`` copies its loss and gradient norm to the host: the steps that log, save or
        validate, and every step with training.skip_nonfinite_steps or stability.spike_guard (they decide before
        the update)."""
        c, last = self.config, step == self.config.training.steps
        validates = self.val_dataloader is not None and (step % c.validation.freq == 0 or last)
        return (c.training.skip_nonfinite_steps or self.spike_guard is not None
                or self.metrics.should_log(step, last=last) or validates or self.checkpointer.saves_at(step, last=last))

    def check_finite(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> StepResult | None:
        """On a reading step, stop (or skip) a non-finite step before its update. Other steps only note it
        on the device; the next reading step stops the run naming it, before anything of it is saved."""
        step = self.step + 1
        if not self.reads_loss_at(step):
            self.finite_watch.record(step, loss, grad_norm)
            return None
        self.stop_if_nonfinite_since_last_read()
        loss_value, norm_value = float(loss), float(grad_norm)
        if math.isfinite(loss_value) and math.isfinite(norm_value):
            return self.skip_if_spike(loss_value, norm_value)
        return self.handle_nonfinite(loss_value, norm_value)

    def skip_if_spike(self, loss: float, grad_norm: float) -> StepResult | None:
        """With [stability] spike_guard: a finite loss far above the recent ones skips the update (spike_guard.py)."""
        if self.spike_guard is None or not self.spike_guard.judge(self.step + 1, loss, is_rank0=self.is_rank0):
            return None
        self.optimizer.zero_grad()
        self.skipped_steps += 1
        return StepResult(loss, grad_norm, skipped=True, spiked=True, rolls_back=self.spike_guard.rollback_due())

    def stop_if_nonfinite_since_last_read(self) -> None:
        bad = self.finite_watch.first_bad_step()
        if bad:
            raise NonFiniteError(
                f"step {bad}: non-finite loss or gradient norm, found at step {self.step + 1} (the loss is read on "
                f"the host only on logging, checkpoint and validation steps). Steps {bad} to {self.step} changed "
                f"the weights in memory only: nothing of them was saved, the last checkpoint holds the last good "
                f"state. Lower optimizer.lr, check the data, or set --training.skip_nonfinite_steps=true, which "
                f"reads every step's loss and skips such steps."
            )

    @torch.no_grad()
    def measure_attention_logits(self, adjust: Adjust) -> AttentionLogits:
        """[stability] qk_clip_threshold: a forward of the step's last micro-batch with the updated weights,
        each attention head's largest logit recorded and ``adjust`` applied (models/attention_logits.py)."""
        inputs, labels, positions = self.last_micro_batch
        # Labels too, as the training forward had them: a model's parts that run only with them (deepseek_v3's
        # multi-token prediction block) are measured and clipped as well; the terms they hand over are dropped.
        labelled = {LABELS_KWARG: to_device(labels, self.device)} if self.passes_labels else {}
        with attention_logits(adjust) as request, self.autocast(), self.head_request():
            self.calls.forward(self.model_parts[0], to_device(inputs, self.device), vocab=self.declared_vocab(),
                               **self.model_kwargs(positions), **labelled)
        self.loss_terms.drop_pending()
        self.moe.drop_forward()
        reshard(self.model_parts)  # FSDP2 keeps some blocks gathered after a forward: the clip changes the shards
        return request

    def step_forward_backward(self, batches: Iterator[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Forward and backward of every accumulation micro-batch; the step's loss on this rank."""
        # Every micro-batch is read first: the loss is a mean over the step's valid labels.
        micro_batches = [self.prepare_batch(*self.next_batch(batches)) for _ in range(self.accum)]
        self.last_micro_batch = micro_batches[-1]
        self.step_valid_tokens = self.count_step_tokens(micro_batches)
        self.z_loss.start_step()
        self.pp_schedule_steps = 0  # pipeline_forward_backward: schedule steps run in this optimizer step
        return sum((self.forward_backward(*mb) for mb in micro_batches), torch.zeros((), device=self.device))

    def next_batch(self, batches: Iterator[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        with self.profiler.phase("data"):
            return next(batches)

    def global_average_loss(self, loss: torch.Tensor) -> float:
        """``global_loss_on_device``, read on the host."""
        return float(self.global_loss_on_device(loss))

    def global_loss_on_device(self, loss: torch.Tensor) -> torch.Tensor:
        """Mean over data-parallel (and context-parallel) ranks; non-last pipeline stages contribute zero, TP ranks
        repeat."""
        if not self.dims.distributed:
            return loss
        total = distributed.all_reduce_sum(loss.float())
        return total.double() / (self.dims.dp_cp * self.dims.tp)  # float64: the figure a host division gave

    def handle_nonfinite(self, loss: float, grad_norm: float) -> StepResult:
        if not self.config.training.skip_nonfinite_steps:
            what = f"step {self.step + 1}: non-finite {'loss' if not math.isfinite(loss) else 'gradient norm'}"
            if self.step == self.started_at_step:  # no update has run: the learning rate cannot be the cause
                raise NonFiniteError(
                    f"{what} (loss={loss}, grad_norm={grad_norm}) in this run's first step, before any update: the "
                    f"weights are as the run started them, so the learning rate is not the cause. The model's "
                    f"forward or init (spec \"{self.spec.name}\"), a converter "
                    f"({', '.join(self.config.model.converters) or 'none in this run'}) or the starting weights "
                    f"produced it; a run without the converters, or from fresh weights, tells them apart."
                )
            raise NonFiniteError(
                f"{what} (loss={loss}, grad_norm={grad_norm}). Training stopped before the optimizer step, so the last "
                f"checkpoint holds the last good state. Lower optimizer.lr, check the data, or set "
                f"--training.skip_nonfinite_steps=true to skip such steps."
            )
        self.optimizer.zero_grad()
        self.skipped_steps += 1
        return StepResult(loss, grad_norm, skipped=True)

    # ---- the loop --------------------------------------------------------------------------------
    def train(self) -> list[float]:
        """Resume if there is a checkpoint, then: step -> log -> checkpoint -> maybe validate."""
        with sigterm_stops_at_once():  # nothing trained yet: a SIGTERM during a long load stops the run at once
            if not self.start_run():
                return []
        t = self.config.training
        self.profiler.check_window(first_step=self.step + 1, last_step=t.steps)
        batches = iter(self.dataloader)
        tokens_per_step = t.local_batch_size * t.seq_len * self.accum
        # TP and PP ranks share their data-parallel rank's batch, so each device's share is
        # 1/(tp*pp) of it; the logger's x world_size is then the true global token rate.
        tokens_per_device = tokens_per_step * self.dims.dp / self.dims.world_size
        # Each step's loss stays on the device until LOSS_BATCH have gathered (no host sync per step), then they
        # are read into `history`: 8 bytes a step. Keeping every step's tensor (a tensor object and its
        # storage, each step) grew a long run's resident memory without end.
        losses: list[torch.Tensor | float] = []
        history = array("d")
        progress("first step (building kernels, loading data) ...", is_rank0=self.is_rank0)
        reset_peak_memory(self.device)  # the peak then counts the steps, not the set-up's transients
        if self.ema is not None:
            self.ema.start()  # from the weights the run starts from, unless the checkpoint held an EMA
        # Throughput is measured over the logging window (since the last log): a logging step's
        # host read waits for the device work of the unlogged steps before it too.
        window_start, window_steps = time.perf_counter(), 0
        first_step = self.step + 1
        self.started_at_step = self.step  # after the resume: a non-finite first step cannot be the LR's doing
        self.stop_vote = StopVote(self.device, distributed=self.dims.distributed)
        while self.step < t.steps:
            window_steps += 1
            self.profiler.before_step(self.step + 1)
            try:
                with out_of_memory_named(f"in step {self.step + 1}"):  # activations: not in the check before training
                    result = self.train_step(batches)
            except NonFiniteError:
                self.checkpointer.wait()  # an async save of the last good step is published before stopping
                raise
            self.step += 1
            if self.ema is not None and not result.skipped:
                self.ema.after_step(self.step)
            self.tokens_seen += tokens_per_step * self.dims.dp
            losses.append(result.loss)
            if len(losses) >= LOSS_BATCH:
                history.extend(float(loss) for loss in losses)
                losses.clear()
            last = self.step == t.steps
            data_ms = self.dataloader.wait_ms()  # time this step waited for its batches
            self.profiler.after_step(self.step, last=last)
            logs = self.metrics.should_log(self.step, last=last) or result.spiked  # a skipped spike gets its record
            if logs:
                loss, grad_norm = float(result.loss), float(result.grad_norm)  # waits for the device
                self.metrics.log_step(
                    step=self.step, loss=loss, grad_norm=grad_norm, lr=self.lr_schedulers.get_last_lr(),
                    tokens=tokens_per_device, step_time=(time.perf_counter() - window_start) / window_steps,
                    extra={"skipped_steps": self.skipped_steps, "tokens_seen": self.tokens_seen, "data_ms": data_ms,
                           "window_steps": window_steps, **source_tokens(self.dataloader.state_dict(), t.seq_len),
                           **self.moe.metrics, **self.loss_terms.metrics, **self.stability_metrics(result),
                           **self.step_metrics(),
                           **self.layer_figures},
                )
                self.layer_figures = {}
            if result.rolls_back and self.roll_back_after_spikes():
                continue  # from the checkpoint's step, on the data after the spikes
            with no_interrupt():  # Ctrl+C waits for the save to be published: never half a checkpoint
                self.checkpointer.maybe_save(self.step, tokens_seen=self.tokens_seen, last=last)
            self.maybe_validate(last=last)
            self.maybe_evaluate(last=last)
            self.stop_if_signalled(read_now=logs or self.step == first_step)
            if logs:
                window_start, window_steps = time.perf_counter(), 0
        self.stop_vote.close()
        self.finish()
        history.extend(float(loss) for loss in losses)
        return history.tolist()

    def start_run(self) -> bool:
        """Resume from the run's checkpoint or load the starting weights, and write the run's files; False when
        the run's own checkpoint is already at the last step (nothing to train)."""
        resumed = self.checkpointer.resume()
        if resumed is not None:
            self.step, self.tokens_seen = resumed.step, resumed.tokens_seen
            progress(f"resuming from {resumed.path} at step {resumed.step}", is_rank0=self.is_rank0)
            # the run's own checkpoint already at the end: nothing to do. A checkpoint from elsewhere
            # (--checkpoint.resume=PATH into a new run folder) still runs the end of a run (its export).
            own = Path(resumed.path).resolve().is_relative_to(Path(self.checkpointer.folder).resolve())
            if self.step >= self.config.training.steps and own:
                self.nothing_to_train()
                return False

            check_shape_file_unchanged(self.spec, self.resolved.weights, self.run_dir)
        else:  # the run's own checkpoints take precedence over checkpoint.initial_load

            load_starting_weights(self.resolved.weights, spec=self.spec, model_parts=self.model_parts, ties=self.ties,
                                  is_rank0=self.is_rank0)
        if self.is_rank0:  # written once resume is accepted: a refused run leaves the run folder as it was
            # A signal waits for these files: config.toml and the metrics set aside stay consistent with each other.
            with no_interrupt():
                self.require_writable_run_files()
                atomic_write_text(self.run_dir / "config.toml", dumps(self.config.model_dump(mode="json")))
                if resumed is None:
                    record_shape_file(self.resolved.weights, self.run_dir)
                self.set_aside_later_metrics()
                if self.converters:
                    self.conversion_table.write(self.run_dir / "conversion_table.json")
        return True

    def set_aside_later_metrics(self) -> None:
        """One record per step after a resume: the records past the starting step are moved aside (this run
        trains those steps again). Rank 0, once the run folder is accepted."""
        supersede_metrics(self.metrics.path, start_step=self.step)

    def nothing_to_train(self) -> None:
        """A resume whose checkpoint is already at (or past) training.steps: as torchtitan, nothing is trained
        and the command succeeds; unlike a run, it writes nothing (config.toml, metrics, report, export
        stay as the run left them), and says so."""
        steps = self.config.training.steps
        where = "at" if self.step == steps else "past"
        if self.is_rank0:
            say(f"[titan] nothing to train: the run's last checkpoint is at step {self.step}, {where} "
                f"--training.steps={steps}. The run folder {self.run_dir} is left as it was (config.toml, "
                f"metrics and checkpoints unchanged). To train on, give --training.steps above {self.step}; to "
                f"start a new run, give another --job.run_dir.")
        self.dataloader.close()

    def stability_metrics(self, result: StepResult) -> dict[str, float]:
        """A logging step's ``z_loss`` (a collective over every rank); ``spike_skipped`` and ``spike_rollback``
        on the steps they mark ([stability])."""
        figures: dict[str, float] = {}
        if self.z_loss.enabled:
            figures["z_loss"] = self.z_loss.step_value(global_valid=self.step_valid_tokens, tp=self.dims.tp,
                                                       distributed=self.dims.distributed)
        if result.spiked:  # only on the records it marks: a later record of the same step (after a rollback)
            figures["spike_skipped"] = 1  # does not unmark it in titan-report, which keeps a step's last value
        if result.rolls_back:
            figures["spike_rollback"] = 1
        return figures

    def roll_back_after_spikes(self) -> bool:
        """[stability] spike_rollback: load the run's newest checkpoint but keep the data where it is (the batches
        since that checkpoint are skipped). False, and training goes on, when there is no checkpoint yet."""
        assert self.spike_guard is not None  # only a guarded step rolls back
        step = self.step
        self.checkpointer.wait()  # an async save in flight is the newest checkpoint once published
        data = self.dataloader.state_dict()
        resumed = self.checkpointer.resume(newest=True)
        if resumed is not None:
            self.dataloader.load_state_dict(data)  # the checkpoint's data position would replay the spikes
            self.step, self.tokens_seen = resumed.step, resumed.tokens_seen
        self.spike_guard.rolled_back(step=step, to_step=None if resumed is None else resumed.step,
                                     is_rank0=self.is_rank0)
        return resumed is not None

    def step_metrics(self) -> dict[str, float]:
        """Figures a subclass adds to each step's metrics record (fault tolerance: the live replica groups)."""
        return {}

    def require_writable_run_files(self) -> None:
        """Every file and folder the run writes is writable, checked before it writes the first one."""

        c = self.config.checkpoint
        export = [self.run_dir / "export"] if c.export_at_end else []
        require_writable(folders=[self.run_dir, *export], files=[self.run_dir / "config.toml", self.metrics.path])

    def stop_if_signalled(self, *, read_now: bool = True) -> None:
        """After a SIGTERM, every rank stops after the same step: the one where they read their vote
        (stop_vote.py: read one step late, or at once on steps that read the device anyway)."""
        signum = self.stop_vote.after_step(read_now=read_now)
        if signum:
            self.stop_vote.close()
            self.stop_if_nonfinite_since_last_read()  # the save on SIGTERM must not hold an unread NaN step
            stop_after_signal(signum, step=self.step, tokens_seen=self.tokens_seen, checkpoint=self.config.checkpoint,
                              checkpointer=self.checkpointer, metrics=self.metrics, is_rank0=self.is_rank0)

    @torch.no_grad()
    def maybe_validate(self, *, last: bool) -> None:
        v = self.config.validation
        if self.val_dataloader is None or not (self.step % v.freq == 0 or last):
            return
        for part in self.model_parts:
            part.eval()
        self.val_dataloader.reset()  # every validation scores the same held-out batches
        batches = iter(self.val_dataloader)
        total = torch.zeros((), device=self.device, dtype=torch.float64)
        valid = 0
        for _ in range(v.steps):
            inputs, labels, positions = self.prepare_batch(*next(batches))
            valid += count_valid(labels)
            total += self.validation_loss(inputs.to(self.device), labels.to(self.device), positions)
        for part in self.model_parts:
            part.train()
        # Per valid token of every batch on every data-parallel rank, as the training loss.
        loss = global_token_mean(total, valid=valid, tp=self.dims.tp, pp=self.dims.pp, device=self.device)
        self.metrics.log_validation(step=self.step, loss=loss)

    def validation_loss(self, inputs: torch.Tensor, labels: torch.Tensor,
                        positions: torch.Tensor | None = None) -> torch.Tensor:
        """One held-out batch's summed token losses, float64 (forward only); zero on ranks without the
        last PP stage."""
        with self.autocast(), self.loss_context(), self.sequence_attention(positions):
            if self.pipeline is None:
                with self.head_request() as request:
                    output = self.calls.forward(self.model_parts[0], inputs, vocab=self.declared_vocab(),
                                                **self.model_kwargs(positions))
                valid = count_valid(labels)
                return _plain(token_loss_sum(self.micro_batch_loss(output, labels, request, valid=valid),
                                             valid=valid)).double()
            pipe = self.pipeline
            losses: list[torch.Tensor] | None = [] if pipe.has_last_stage else None
            target = labels if pipe.has_last_stage else None
            args = (inputs,) if pipe.has_first_stage else ()
            with self.head_request() as self.pipe_head:
                pipe.schedule.eval(*args, target=target, losses=losses, **self.model_kwargs(positions))
            self.pipe_head = None
        if losses:  # each microbatch's sum (scaled_loss under no_grad)
            return torch.stack([_plain(loss) for loss in losses]).double().sum()
        return torch.zeros((), device=self.device, dtype=torch.float64)

    def finish(self) -> None:
        self.dataloader.close()
        self.checkpointer.wait()
        # The steps' freed activations stay in the heap (keep_freed_memory_in_heap); handed back now, the
        # export and the report (matplotlib: 23-26 MB above the peak, docs/benchmarks.md) reuse those pages.
        release_freed_memory()
        weights = self.config.checkpoint.export_weights
        with self.ema.swapped_in() if weights == "ema" and self.ema is not None else contextlib.nullcontext():
            if self.config.checkpoint.export_at_end and self.config.checkpoint.export_format == "hf":
                export_hf(self.model_parts, self.run_dir / "export" / "hf", spec=self.spec, model_args=self.model_args,
                          tokenizer=self.tokenizer, dtype=getattr(torch, self.config.checkpoint.export_dtype),
                          shard_gb=self.config.checkpoint.export_shard_gb, is_rank0=self.is_rank0, weights=weights)
            elif self.config.checkpoint.export_at_end:
                dtype = getattr(torch, self.config.checkpoint.export_dtype)
                export_safetensors(self.model_parts, self.run_dir / "export" / "model.safetensors", dtype=dtype,
                                   is_rank0=self.is_rank0, weights=weights)
        self.metrics.close()
        self.profiler.close()
        if self.is_rank0 and self.config.metrics.report:
            report_at_end(self.run_dir)

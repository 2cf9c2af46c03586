"""JobConfig: the core sections plus one section per requested plugin.

The set of sections depends on which spec and converters are requested, so the
model is built per run with ``build_job_model``; plugin sections are validated by
the plugin's own pydantic model. Cross-field checks of the core's sections live here,
in one validator, which also derives the run's parallel degrees (``parallel_dims``).
Checks that need a plugin (the spec's ``validate_fn``, a converter's ``__init__``)
run when ``resolve_config`` loads it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    create_model,
    model_validator,
)

from ..errors import ConfigError
from .context_parallel_rules import check_context_parallel
from .fault_tolerance import FaultToleranceSection
from .parallel_dims import ParallelDims
from .sections import (
    ActivationCheckpointSection,
    CheckpointSection,
    CompileSection,
    DataSection,
    EmaSection,
    EvalSection,
    JobSection,
    LRSchedulerSection,
    MetricsSection,
    ModelSection,
    OptimizerSection,
    ParallelismSection,
    ProfilingSection,
    TrainingSection,
    ValidationSection,
)
from .stability import StabilitySection


class JobConfig(BaseModel):
    """The validated configuration of one run. Plugin sections are extra fields added per run."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    job: JobSection = Field(default_factory=JobSection, description="Run folder and description.")
    model: ModelSection = Field(default_factory=ModelSection, description="Which spec, flavor and converters.")
    training: TrainingSection = Field(default_factory=TrainingSection, description="Steps, batch, precision, seed.")
    optimizer: OptimizerSection = Field(default_factory=OptimizerSection, description="Optimizer settings.")
    ema: EmaSection = Field(default_factory=EmaSection, description="Exponential moving average of the weights.")
    stability: StabilitySection = Field(default_factory=StabilitySection, description="z-loss and the loss-spike guard.")
    lr_scheduler: LRSchedulerSection = Field(default_factory=LRSchedulerSection, description="Warmup and decay.")
    data: DataSection = Field(default_factory=DataSection, description="Dataset and tokenizer.")
    validation: ValidationSection = Field(default_factory=ValidationSection, description="Held-out evaluation.")
    eval: EvalSection = Field(default_factory=EvalSection, description="Tasks scored during and after training (docs/evaluation.md).")
    parallelism: ParallelismSection = Field(default_factory=ParallelismSection, description="Parallel degrees and schedules.")
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection, description="Checkpointing and resume.")
    metrics: MetricsSection = Field(default_factory=MetricsSection, description="Console, JSONL and W&B metrics.")
    compile: CompileSection = Field(default_factory=CompileSection, description="torch.compile.")
    activation_checkpoint: ActivationCheckpointSection = Field(
        default_factory=ActivationCheckpointSection, description="Activation checkpointing."
    )
    profiling: ProfilingSection = Field(default_factory=ProfilingSection, description="torch.profiler traces and memory snapshots.")

    fault_tolerance: FaultToleranceSection = Field(
        default_factory=FaultToleranceSection, description="torchft replica groups (docs/fault-tolerance.md)."
    )

    _parallel_dims: ParallelDims | None = PrivateAttr(default=None)

    @property
    def parallel_dims(self) -> ParallelDims:
        """The parallel degrees for the world size this config was validated with (``dp_shard=-1`` filled)."""
        assert self._parallel_dims is not None  # set by the validator below, which always runs
        return self._parallel_dims

    @model_validator(mode="after")
    def _cross_field_checks(self, info: ValidationInfo) -> JobConfig:
        """Checks that span sections; the world size comes from the validation context."""
        # An assignment (validate_assignment) has no context: keep the world size validated before.
        before = self._parallel_dims.world_size if self._parallel_dims is not None else 1
        world_size = int((info.context or {}).get("world_size", before))
        p, t = self.parallelism, self.training
        if p.pp > 1 and p.pp_schedule in _SCHEDULES_WITHOUT_EVAL and self.validation.enable:
            raise ValueError(
                f"validation.enable=true with parallelism.pp_schedule={p.pp_schedule}: torch's V-shaped pipeline "
                f"schedules have no forward-only pass (validation hangs or fails inside torch 2.13). Use "
                f"Interleaved1F1B or InterleavedZeroBubble (also several stages per rank), 1F1B or GPipe, or turn "
                f"validation off"
            )
        if p.etp not in (1, p.tp):
            raise ValueError(
                f"parallelism.etp={p.etp} with parallelism.tp={p.tp}: expert tensor parallelism splits each expert over "
                f"the tp ranks, so etp is 1 (experts replicated over tp) or equal to tp ({p.tp})"
            )
        # The one place the degrees are derived (and checked against the world size).
        dims = ParallelDims.resolve(dp_replicate=p.dp_replicate, dp_shard=p.dp_shard, tp=p.tp, pp=p.pp,
                                    world_size=world_size, ep=p.ep, cp=p.cp)
        ft = self.fault_tolerance
        check_context_parallel(p, seq_len=t.seq_len, features_on={
            "stability.qk_clip_threshold": bool(self.stability.qk_clip_threshold),
            # its max_attn_logit would be over this rank's own keys only
            "metrics.layer_stats": self.metrics.layer_stats,
        })
        self._parallel_dims = dims
        per_step = t.local_batch_size * dims.dp
        if t.global_batch_size is not None and t.global_batch_size % per_step:
            raise ValueError(
                f"training.global_batch_size={t.global_batch_size} must be a multiple of local_batch_size "
                f"({t.local_batch_size}) x data-parallel degree ({dims.dp}) = {per_step}"
            )
        if p.pp > 1:
            n_micro = p.pp_microbatches or p.pp * p.pp_stages_per_rank
            if t.local_batch_size % n_micro:
                raise ValueError(
                    f"parallelism.pp_microbatches={n_micro} does not divide training.local_batch_size="
                    f"{t.local_batch_size}. Choose a number of microbatches that divides the local batch"
                    + (" (the default is the number of stages)" if p.pp_microbatches is None else "")
                )
        ft = self.fault_tolerance
        if self.ema.decay is not None and (ft.enable or ft.local_replicas):
            raise ValueError("ema.decay with fault tolerance is not supported yet: a replica group that heals from a "
                             "peer does not receive the peer's EMA. Unset ema.decay, or train without fault_tolerance")
        if self.checkpoint.export_weights == "ema" and self.ema.decay is None:
            raise ValueError("checkpoint.export_weights=ema needs an EMA of the weights: set ema.decay (e.g. "
                             "--ema.decay=0.999), or export the raw weights (checkpoint.export_weights=raw)")
        if self.stability.spike_guard and (ft.enable or ft.local_replicas):
            raise ValueError("stability.spike_guard with fault tolerance is not supported yet: the replica groups' step "
                             "does not consult the guard. Set stability.spike_guard=false, or train without "
                             "fault_tolerance")
        if self.stability.qk_clip_threshold and p.pp > 1:
            raise ValueError(f"stability.qk_clip_threshold={self.stability.qk_clip_threshold} works on one process, "
                             f"under FSDP2 and under tensor parallelism, not yet with parallelism.pp={p.pp}: set it to "
                             f"1, or leave qk_clip_threshold at 0")
        if (self.stability.qk_clip_threshold or self.metrics.layer_stats) and (ft.enable or ft.local_replicas):
            key = "stability.qk_clip_threshold" if self.stability.qk_clip_threshold else "metrics.layer_stats"
            raise ValueError(f"{key} with fault tolerance is not supported yet: the replica groups' step does not "
                             f"run it. Turn {key} off, or train without fault_tolerance")
        if self.stability.spike_rollback and not self.checkpoint.enable:
            raise ValueError(f"stability.spike_rollback={self.stability.spike_rollback} rolls back to the run's newest "
                             "checkpoint: set checkpoint.enable=true (and a checkpoint.interval), or leave it at 0")
        if self.eval.weights == "ema" and self.ema.decay is None:
            raise ValueError("eval.weights=ema scores the EMA of the weights: set ema.decay (e.g. --ema.decay=0.999), "
                             "or score the trained weights (eval.weights=raw)")
        c = self.checkpoint
        if not c.enable and c.resume not in ("auto", "never"):
            # checkpoint.enable governs loading as well as saving: the named checkpoint would be ignored and the
            # run would start from step 1 over the run folder's records.
            raise ValueError(f"checkpoint.resume={c.resume} names a checkpoint to resume, but checkpoint.enable is "
                             f"false, and nothing is loaded or saved without it. Add --checkpoint.enable=true to "
                             f"resume from it, or start a new run from its weights alone with "
                             f"--checkpoint.initial_load=PATH")
        if self.checkpoint.async_mode == "async" and not self.checkpoint.enable:
            raise ValueError("checkpoint.async_mode=async needs checkpoint.enable=true")
        return self


# The core's sections, read from the model itself: a section added later is reserved at once (a hand-kept
# list once left out fault_tolerance, and a plugin of that name replaced it).
CORE_SECTIONS: tuple[str, ...] = tuple(JobConfig.model_fields)

# Pipeline schedules whose eval() deadlocks (ZBVZeroBubble) or asserts (DualPipeV) in torch 2.13.
_SCHEDULES_WITHOUT_EVAL = ("ZBVZeroBubble", "DualPipeV")


def accumulation_steps(config: JobConfig, dp: int) -> int:
    """Micro-steps per optimizer step for data-parallel degree ``dp``."""
    t = config.training
    if t.global_batch_size is None:
        return 1
    return t.global_batch_size // (t.local_batch_size * dp)


def _defaults_of(name: str, model: type[BaseModel]) -> Callable[[], BaseModel]:
    """The section's defaults; defaults that fail the plugin's own validation name the section."""

    def make() -> BaseModel:
        try:
            return model()
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or name}: {e['msg']}" for e in exc.errors())
            raise ConfigError(
                f"the defaults of plugin section [{name}] ({model.__module__}.{model.__qualname__}) fail its own "
                f"validation ({problems}). Set the values explicitly (--{name}.KEY=VALUE or a [{name}] table in "
                f"--config), or fix the plugin's defaults."
            ) from None

    return make


def build_job_model(plugin_sections: dict[str, type[BaseModel]]) -> type[JobConfig]:
    """A JobConfig subclass with one extra section per requested plugin (name -> its model)."""
    if not plugin_sections:
        return JobConfig
    fields: dict[str, Any] = {
        name: (model, Field(default_factory=_defaults_of(name, model), description=f"Section of plugin {name}."))
        for name, model in plugin_sections.items()
    }
    return create_model("JobConfig", __base__=JobConfig, **fields)

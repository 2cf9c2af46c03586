"""The core's configuration sections, one pydantic model each.

Every model forbids unknown keys; every field carries a one-line description that
feeds ``--schema`` and docs/configuration.md. Plugin sections are not declared
here: the core keeps them as raw data until the plugin's own model validates them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# torch.optim.Adam rejects a beta outside [0, 1) only when the optimizer is built; check it up front.
Beta = Annotated[float, Field(ge=0, lt=1)]


class Section(BaseModel):
    """Base for every config section: unknown keys are errors, assignment is validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class JobSection(Section):
    run_dir: str = Field("runs/default", description="Folder for metrics, conversion table and checkpoints.")
    description: str = Field("", description="Free text recorded with the run.")

    @field_validator("run_dir")
    @classmethod
    def _run_dir_not_empty(cls, value: str) -> str:
        if not value.strip():  # "" would put checkpoints and metrics in the current folder, unasked
            raise ValueError("empty; give the folder for this run's files, e.g. --job.run_dir=runs/exp1")
        return value


class ModelSection(Section):
    spec: str | None = Field(None, description="TrainSpec name (entry point in titan.train_specs); unset: the only installed spec.")
    flavor: str = Field("debugmodel", description="Named model size from the spec's flavors.")
    converters: list[str] = Field(default_factory=list, description="ModelConverter names, applied in this order; later wins on overlap.")
    plugin_timeout_s: float = Field(1800.0, gt=0, le=604800, description="Seconds one call into a plugin (a converter's __init__/select/convert, the spec's parallelize_fn, init or one forward) may take before the run stops naming it.")

    @model_validator(mode="after")
    def _no_duplicate_converters(self) -> ModelSection:
        seen: set[str] = set()
        for name in self.converters:
            if name in seen:
                raise ValueError(f'converter "{name}" is listed twice in model.converters; list each converter once')
            seen.add(name)
        return self


class TrainingSection(Section):
    steps: int = Field(200, gt=0, description="Number of optimizer steps to train.")
    local_batch_size: int = Field(8, gt=0, description="Sequences per data-parallel rank per micro-step.")
    global_batch_size: int | None = Field(None, gt=0, description="Sequences per optimizer step over all ranks; a multiple of local_batch_size x dp degree (gradient accumulation). Default: no accumulation.")
    seq_len: int = Field(256, gt=0, description="Tokens per training sequence.")
    max_norm: float = Field(1.0, ge=0, description="Gradient clipping norm; 0 disables clipping.")
    seed: int = Field(0, description="Seed for weights, data order and dropout.")
    deterministic: bool = Field(False, description="Use deterministic algorithms (slower on GPU); sets CUBLAS_WORKSPACE_CONFIG=:4096:8 unless already set.")
    dtype: Literal["auto", "float32", "bfloat16"] = Field("auto", description="Compute dtype: auto = bfloat16 autocast on CUDA, float32 on CPU.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="Device: auto = CUDA when available.")
    cpu_malloc_tuning: bool = Field(True, description="On CPU with glibc, keep freed memory in the heap instead of re-mapping big buffers every step (faster).")
    chunked_loss: bool = Field(True, description="Apply the output head and the cross-entropy a chunk of tokens at a time, so the full float32 logits and their gradient are never held at once (models whose forward ends in titan_core's final_norm_and_head, with the built-in loss; off under the zero-bubble pipeline schedules, whose backward runs in two passes). false: the full logits.")
    loss_chunk_tokens: int = Field(0, ge=0, description="Tokens per chunk of the chunked loss; 0 = as many as fit 64 MiB of float32 logits.")
    skip_nonfinite_steps: bool = Field(False, description="Skip (and count) steps with a non-finite loss or grad norm instead of stopping. This reads every step's loss on the host (a wait for the accelerator); otherwise it is read only on logging, checkpoint and validation steps.")


class ParamGroupRule(Section):
    """One optimizer parameter group: the parameters whose names match a pattern, with their own settings."""

    name: str = Field(description="Group name, recorded in checkpoints (resuming with other groups is refused).")
    patterns: list[str] = Field(min_length=1, description="fnmatch patterns over parameter names (e.g. 'tok_embeddings.*', '*.bias'); the first rule that matches a parameter takes it.")
    weight_decay: float | None = Field(None, ge=0, description="This group's weight decay; unset = optimizer.weight_decay.")
    lr_mult: float = Field(1.0, ge=0, description="This group's learning rate as a multiple of the scheduled LR.")

    @field_validator("name")
    @classmethod
    def _reserved(cls, value: str) -> str:
        if not value.strip() or value in ("default", "no_decay"):
            raise ValueError(f"{value!r} is empty or reserved (default and no_decay are the built-in groups); choose another name")
        return value


class OptimizerSection(Section):
    name: Literal["AdamW", "Adam", "SGD", "Muon"] = Field("AdamW", description="torch.optim optimizer class, or Muon: Muon for the weight matrices and AdamW (betas, eps) for embeddings, the output head, norms and biases (optim/muon.py; docs/optimizer.md). Any letter case.")
    lr: float = Field(3e-3, ge=0, description="Peak learning rate (0 keeps the weights as loaded, e.g. to check a round trip).")
    betas: tuple[Beta, Beta] = Field((0.9, 0.95), description="Adam betas, each in [0, 1).")
    eps: float = Field(1e-8, gt=0, description="Adam epsilon.")
    weight_decay: float = Field(0.1, ge=0, description="Decoupled weight decay.")
    implementation: Literal["auto", "foreach", "for-loop", "fused"] = Field("auto", description="Kernel: auto = fused on CUDA, foreach elsewhere; where DTensor and plain parameters mix (some TP plans), fused and foreach fall back to for-loop, saying so.")
    no_decay_norms_biases_embeddings: bool = Field(True, description="Put norms and biases (parameters with fewer than 2 dims), embedding tables (nn.Embedding and weights tied to one) in the no_decay group (weight decay 0); false = decay every parameter.")
    param_groups: list[ParamGroupRule] = Field(default_factory=list, description="Extra parameter groups, matched by name before the built-in default/no_decay split (TOML: [[optimizer.param_groups]] tables).")
    muon_momentum: float = Field(0.95, ge=0, lt=1, description="Muon only: momentum of the matrices' SGD momentum.")
    muon_nesterov: bool = Field(True, description="Muon only: Nesterov momentum (orthogonalise the gradient pulled toward the momentum).")
    muon_ns_steps: int = Field(5, ge=1, le=20, description="Muon only: Newton-Schulz iterations per orthogonalisation.")

    @field_validator("name", mode="before")
    @classmethod
    def _any_letter_case(cls, value: object) -> object:
        known = {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD", "muon": "Muon"}
        return known.get(value.lower(), value) if isinstance(value, str) else value

    @field_validator("param_groups")
    @classmethod
    def _unique_group_names(cls, value: list[ParamGroupRule]) -> list[ParamGroupRule]:
        names = [rule.name for rule in value]
        if len(set(names)) != len(names):
            raise ValueError(f"group names {names} repeat; give each group its own name")
        return value


class EmaSection(Section):
    """An exponential moving average of the weights, kept beside them (train/ema.py, docs/optimizer.md)."""

    decay: float | None = Field(None, gt=0, lt=1, description="Keep an EMA of the weights: after every interval-th optimizer step, ema = decay * ema + (1 - decay) * weight, in float32 (e.g. 0.999); unset = no EMA.")
    interval: int = Field(1, ge=1, description="Update the EMA every N optimizer steps (1 = every step).")


class LRSchedulerSection(Section):
    warmup_steps: int = Field(20, ge=0, description="Linear warmup steps from ~0 to the peak LR.")
    decay_type: Literal["linear", "cosine", "wsd", "constant"] = Field("cosine", description="Decay after warmup; wsd = constant then decay in the last decay_ratio of steps.")
    decay_ratio: float = Field(0.2, gt=0, le=1, description="For wsd: fraction of steps spent decaying.")
    wsd_decay_shape: Literal["linear", "cosine", "1-sqrt"] = Field("linear", description="For wsd: shape of the decay tail (1-sqrt: 1 - sqrt(progress)).")
    min_lr_factor: float = Field(0.1, ge=0, le=1, description="LR at the end of decay, as a fraction of the peak.")


class MixSource(Section):
    source: str = Field(description='A data source as data.source: "builtin", a file or folder, "hf:<name>" or "tokens:<dir>" (titan-data prepare).')
    weight: float = Field(gt=0, description="Relative share of the training rows (weights are normalised to sum to 1).")


class DataSection(Section):
    source: str = Field("builtin", description='"builtin" (a fixed snapshot of CPython 3.11.7 docs and sources shipped in the wheel), a local .txt/.jsonl/.json/.parquet file or folder, "hf:<name>" (opt-in hub download), or "tokens:<dir>" (shards written by titan-data prepare; docs/data.md).')
    text_field: str = Field("text", description="Field holding the text in .jsonl/.json/.parquet rows.")
    hf_split: str = Field("train", description='Split for an "hf:" dataset.')
    allow_download: bool = Field(False, description='Permit "hf:" sources to download (off by default: nothing is fetched at run time).')
    hf_timeout_s: float = Field(60.0, gt=0, le=86400, description='Seconds an "hf:" source may go without delivering data (connecting, or between rows) before the run stops naming it.')
    tokenizer: str = Field("builtin", description='"builtin", a path to a Llama-3-format tokenizer.model (tiktoken BPE ranks), or a Hugging Face model folder (original/tokenizer.model, or tokenizer.json with the hf extra).')
    val_fraction: float = Field(0.05, ge=0, lt=1, description="Fraction of documents held out for validation.")
    document_masking: bool = Field(False, description="Keep the documents of a packed window apart: block-causal attention, positions restarting at each document (split after each EOS token), and the label across a boundary ignored. Needs a model whose forward accepts `positions` (with pp > 1, a spec whose pipeline carries them: TrainSpec.pipeline_takes_positions).")
    mix: dict[str, MixSource] = Field(default_factory=dict, description="Weighted mixture: [data.mix.NAME] source and weight; when set, data.source is not used (docs/data.md).")

    @field_validator("mix")
    @classmethod
    def _mix_names(cls, value: dict[str, MixSource]) -> dict[str, MixSource]:
        for name in value:
            if not name.replace("_", "").isalnum() or not name.isascii():
                raise ValueError(f'mixture source name "{name}": use letters, digits and _ only')
        return value


class ValidationSection(Section):
    enable: bool = Field(False, description="Run a validation loop on the held-out split.")
    freq: int = Field(100, gt=0, description="Validate every N steps.")
    steps: int = Field(4, gt=0, description="Batches per validation.")


class EvalSection(Section):
    tasks: list[str] = Field(default_factory=list, description="Tasks scored on the current weights (docs/evaluation.md): JSONL files of multiple-choice or perplexity examples, 'builtin' (every built-in task) or 'builtin:NAME'; empty = no evaluation.")
    interval: int = Field(100, gt=0, description="Evaluate every N steps, and at the last step.")
    limit: int | None = Field(None, gt=0, description="Score only the first N examples of each task; unset = all of them.")
    batch_size: int = Field(8, gt=0, description="Sequences per forward of the evaluation, on each data-parallel rank.")
    weights: Literal["raw", "ema"] = Field("raw", description="Which weights are scored: raw (the trained weights) or ema (the [ema] average, swapped in for the evaluation; needs ema.decay).")

    @field_validator("tasks")
    @classmethod
    def _tasks_named(cls, value: list[str]) -> list[str]:
        if any(not entry.strip() for entry in value):
            raise ValueError("an empty task name; give JSONL files, 'builtin' or 'builtin:NAME'")
        return value


class ParallelismSection(Section):
    dp_replicate: int = Field(1, ge=1, description="Data-parallel replicas (DDP / HSDP outer dimension).")
    dp_shard: int = Field(-1, description="FSDP2 shard degree; -1 = whatever the world size leaves.")
    tp: int = Field(1, ge=1, description="Tensor-parallel degree.")
    pp: int = Field(1, ge=1, description="Pipeline-parallel degree.")
    ep: int = Field(1, ge=1, description="Expert-parallel degree (MoE specs): the experts of each MoE layer are split over groups of this many data-parallel ranks, carved out of dp_shard (it must divide dp_shard and the number of experts); tokens travel to their experts by all-to-all, and FSDP2 shards each rank's experts over the remaining dp_shard / ep ranks. With cp > 1 the cp ranks join the group: ep is cp times a divisor of dp_shard.")
    etp: int = Field(1, ge=1, description="Expert tensor parallelism (MoE specs): 1 = experts replicated over the tp ranks; equal to tp = each expert's hidden width split over them (w1/w3 column-wise, w2 row-wise), 1/tp of the expert memory per rank. With ep > 1 too, each rank holds hidden/tp of E/ep experts.")
    cp: int = Field(1, ge=1, description="Context-parallel degree: each sequence is split over this many ranks (long context); attention is computed across them exactly (docs/distributed.md). The spec's model must declare support (use_context_parallel_attention); training.seq_len must divide into 2 x cp equal chunks (cp with load balancing).")
    cp_load_balance: bool = Field(True, description="Context parallelism: each rank holds an early and a late chunk of every sequence, so causal attention work is equal over the cp ranks; false holds one contiguous chunk per rank (uneven work; for comparison).")
    pp_schedule: str = Field("1F1B", description="Pipeline schedule: 1F1B, GPipe, Interleaved1F1B, ZBVZeroBubble, ...")
    pp_microbatches: int | None = Field(None, gt=0, description="Microbatches per local batch; default = number of stages.")
    pp_stages_per_rank: int = Field(1, ge=1, description="Stages per pipeline rank (2+ for interleaved schedules).")
    pp_split_points: list[str] = Field(default_factory=list, description="Layer names that start a new stage; empty = balanced automatic split.")
    pp_end_stage_fewer_layers: int = Field(-1, ge=-1, description="Automatic split: layers the first and the last stage each hold fewer than the others, for the embedding and the head; -1 = 1 when every stage would hold at least 4 layers, else 0.")
    pp_static_shapes: bool = Field(True, description="Give each pipeline stage the shapes and dtype it receives and sends before the first step (the residual stream [micro-batch, seq_len / cp / tp, dim]), so that neighbours need no shape handshake; each sent output is checked against them. false = torch learns them from the first micro-batch (a spec whose stages send something else).")
    loss_parallel: bool = Field(True, description="With tp > 1: compute the loss on vocab-sharded logits.")
    fsdp_reshard_after_forward: Literal["default", "always", "never"] = Field("default", description="FSDP2 reshard policy; default = always, except never for the last block.")
    param_dtype: Literal["auto", "float32", "bfloat16"] = Field("auto", description="FSDP2 parameter dtype during compute (what is all-gathered); auto = the compute dtype (bfloat16 when training.dtype resolves to bfloat16). Master weights stay float32.")
    reduce_dtype: Literal["float32", "bfloat16"] = Field("float32", description="FSDP2 gradient reduce dtype.")
    backend: Literal["auto", "gloo", "nccl"] = Field("auto", description="Process-group backend; auto = nccl on CUDA, gloo on CPU.")
    init_timeout_s: float = Field(300.0, gt=0, le=86400, description="Seconds the rendezvous waits for every process to join before giving up.")
    collective_timeout_s: float = Field(600.0, gt=0, le=86400, description="Seconds a collective waits for a rank that stopped answering before the run stops (covers the slowest step, save or compile).")


class CheckpointSection(Section):
    enable: bool = Field(False, description="Save checkpoints with torch.distributed.checkpoint.")
    interval: int = Field(100, gt=0, description="Save every N steps (and at the last step).")
    folder: str = Field("checkpoints", description="Folder for checkpoints, relative to job.run_dir.")
    keep_latest_k: int = Field(2, ge=0, description="Keep this many complete checkpoints; 0 keeps all.")
    async_mode: Literal["disabled", "async"] = Field("disabled", description="async: save in the background after the copy to CPU.")
    resume: str = Field("auto", description='"auto" (newest complete checkpoint in folder), "never", or a path to a checkpoint.')
    allow_converter_change: bool = Field(False, description="Allow resuming with a different converter list (e.g. fine-tune a baseline with float8).")
    allow_data_change: bool = Field(False, description="Allow resuming on data other than the checkpoint's (another source or its content, other mixture weights, a source added or dropped): the data-loader position carries over; false = such a resume is refused, naming the change.")
    export_at_end: bool = Field(False, description="Write the full model weights as safetensors at the end.")
    export_dtype: Literal["float32", "bfloat16"] = Field("float32", description="dtype of the exported weights.")
    export_format: Literal["native", "hf"] = Field("native", description="native: the model's own names in export/model.safetensors; hf: a Hugging Face folder in export/hf/ (config.json, safetensors, tokenizer) through the spec's state_dict_adapter.")
    export_shard_gb: float = Field(5.0, gt=0, description="hf export: start a new safetensors shard (with an index) above this many GB.")
    export_weights: Literal["raw", "ema"] = Field("raw", description="Which weights export_at_end writes: raw (the trained weights) or ema (the [ema] average; needs ema.decay).")
    initial_load: str = Field("", description="Starting weights for step 0 (no optimizer state): a Hugging Face folder (config.json + safetensors; the model shape then comes from config.json) or a titan checkpoint folder. A resume from this run's own checkpoints takes precedence.")
    save_on_sigterm: bool = Field(True, description="On SIGTERM (preemption), save a checkpoint at the next step boundary before exiting 143.")


class MetricsSection(Section):
    log_freq: int = Field(10, gt=0, description="Print and record metrics every N steps; tokens/s, step time and MFU are the means over the steps since the last record.")
    wandb: bool = Field(False, description="Also log to Weights & Biases (respects WANDB_MODE=offline).")
    wandb_project: str = Field("titan", description="W&B project name.")
    tensorboard: bool = Field(False, description="Also write TensorBoard event files (the same scalars as metrics.jsonl, rank 0) to job.run_dir/tensorboard; needs the tensorboard extra.")
    peak_tflops: float | None = Field(None, gt=0, description="Peak bf16 TFLOP/s for MFU; default from a table of known GPUs.")
    conversion_table: Literal["summary", "full"] = Field(
        "summary", description="What the start-up prints of the converters' work: one summary line (the full table is always in job.run_dir/conversion_table.json), or the full table, one row per converted module.")
    layer_stats: bool = Field(False, description="On logging steps only, measure per transformer block (model.layers) its parameter norm, gradient norm before clipping, update/parameter ratio and output activation RMS, global under FSDP2/TP/PP; recorded as layer/<id>/<figure> in metrics.jsonl and drawn by titan-report as layer x step heatmaps. Other steps install and compute nothing.")
    report: bool = Field(True, description="When training ends, write report.html (charts of metrics.jsonl, see titan-report) and report-loss.png into the run folder; a failure to draw is a warning, never an error.")


class ProfilingSection(Section):
    enable: bool = Field(False, description="Profile steps start_step .. start_step+steps-1 with torch.profiler: a trace per rank and a per-step breakdown line.")
    start_step: int = Field(3, ge=1, description="First profiled step (1-based; later than 1 keeps start-up out of the trace).")
    steps: int = Field(2, gt=0, description="Number of profiled steps.")
    folder: str = Field("profile", description="Folder for traces (rank<R>/trace.json, Chrome/Perfetto JSON), relative to job.run_dir.")
    record_shapes: bool = Field(False, description="Record operator input shapes in the trace (larger files).")
    memory_snapshot: bool = Field(False, description="CUDA only: record the allocator history and write memory_snapshot.pickle next to the traces (and memory_snapshot_oom.pickle on out-of-memory).")
    memory_snapshot_entries: int = Field(100000, gt=0, description="Allocator events kept for memory snapshots.")


class CompileSection(Section):
    enable: bool = Field(False, description="torch.compile each transformer block.")


class ActivationCheckpointSection(Section):
    mode: Literal["none", "full", "selective"] = Field("none", description="Activation checkpointing: none, full (every block) or selective.")
    selective_every: int = Field(0, ge=0, description="selective: checkpoint every Nth block (0 = use per-op selective instead).")
    selective_save_ops: list[str] | None = Field(
        None,
        description="selective per-op: ops whose outputs are saved (every other matmul is recomputed, and a block's last one is not kept when its backward never reads it); unset = the spec's list plus the accelerator kernels this torch has (cuDNN/efficient/flash attention, _scaled_mm, _grouped_mm, flex attention).",
    )

"""The two plugin contracts: TrainSpec (a model) and ModelConverter (a model rewrite).

A plugin imports only ``titan_core``'s public API. Everything a plugin receives
is a narrow, validated slice of the job config, never the whole of it.
"""

from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping, Protocol, Sequence

import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from ._version import PLUGIN_API_VERSION

if TYPE_CHECKING:
    from .config.sections import (
        ActivationCheckpointSection,
        CompileSection,
        ParallelismSection,
        TrainingSection,
    )
    from .parallel_dims import ParallelDims


class Tokenizer(Protocol):
    """What the trainer and data loader need from a tokenizer."""

    @property
    def vocab_size(self) -> int: ...
    @property
    def bos_id(self) -> int: ...
    @property
    def eos_id(self) -> int: ...
    def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...


@dataclass(frozen=True)
class RunContext:
    """The read-only facts about this run that a plugin may need besides its own section."""

    device: torch.device
    backend: str  # the process-group backend, resolved ("gloo", "nccl"; never "auto")
    training: "TrainingSection"
    parallelism: "ParallelismSection"
    compile: "CompileSection"


@dataclass(frozen=True)
class TensorParallelStyles:
    """ParallelStyle classes a parallelize_fn uses for linear layers.

    A converter may supply its own (e.g. float8-aware TP) through
    ``ModelConverter.tensor_parallel_styles``; the defaults are torch's.
    """

    colwise: type
    rowwise: type
    prepare_module_input: type

    @staticmethod
    def default() -> "TensorParallelStyles":
        from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel

        return TensorParallelStyles(ColwiseParallel, RowwiseParallel, PrepareModuleInput)


class ParallelizeFn(Protocol):
    """Applies TP -> activation checkpointing -> compile -> FSDP2 to one model part, in place.

    ``mesh`` is the full named DeviceMesh (dims ``pp``, ``dp_replicate``, ``dp_shard``,
    ``tp`` and the flattened ``dp``), or None in a single-process run.
    """

    def __call__(
        self,
        model: nn.Module,
        *,
        parallel_dims: "ParallelDims",
        mesh: Any,
        training: "TrainingSection",
        parallelism: "ParallelismSection",
        compile: "CompileSection",
        activation_checkpoint: "ActivationCheckpointSection",
        tp_styles: TensorParallelStyles,
    ) -> nn.Module: ...


@dataclass(frozen=True)
class TrainSpec:
    """Everything the core needs to train one model family.

    A minimal spec names ``name``, ``model_cls`` and ``flavors`` (plus ``tp_plan_fn`` for
    tensor parallelism); every ``build_*`` factory left as ``None`` uses the core's default.

    Contract for the model (``model_cls(args)``):
      * it can be built under ``torch.device("meta")`` and holds no parallelism code;
      * ``init_parameter(fqn, tensor, generator)`` fills a full-shaped plain tensor
        for the parameter ``fqn``; the core calls it per parameter with a generator
        seeded from (seed, fqn), so weights are identical whatever the layout;
      * ``init_buffers()`` (optional) recomputes non-persistent buffers after
        ``to_empty``;
      * ``tied_weights()`` (optional) names ``(source, alias)`` parameters that are one
        tensor; the core re-ties them after ``to_empty`` and checks them after every
        set-up step, and a parallelize_fn calls ``retie_weights`` after tensor parallelism;
      * ``forward(tokens) -> logits``; with pipelining, a stage's forward takes the
        previous stage's output.
    Factories, when given, are called as the defaults are:
      ``build_optimizers_fn(model_parts, optimizer_section, *, device_type)`` (default
      ``OptimizersContainer``), ``build_lr_schedulers_fn(optimizers, lr_section, *, total_steps)``
      (``LRSchedulersContainer``), ``build_metrics_processor_fn(metrics_section, *, run_dir, is_rank0,
      device, flops_per_token, world_size, run_config)`` (``MetricsLogger``), ``build_loss_fn()``
      returning ``loss(logits, labels)``, ``build_tokenizer_fn(data_section)``, and
      ``build_dataloader_fn(**kwargs of titan_core.build_dataloader)``. ``state_dict_adapter`` (optional,
      a ``titan_core.StateDictAdapter``) maps the model to the Hugging Face format; the core uses it for
      ``checkpoint.initial_load`` of HF folders, the ``hf`` export format and ``titan-convert``.
    Flavor args are dataclasses. A field ``vocab_size`` left ``None`` is filled from
    the tokenizer; fields of the spec's ``config_model`` section that are not
    ``None`` replace the flavor's values.
    """

    name: str
    model_cls: type[nn.Module]
    flavors: Mapping[str, Any]
    # None: titan_core.parallel.default_parallelize_fn built from tp_plan_fn and
    # selective_ac_save_ops (TP -> activation checkpointing -> compile -> FSDP2).
    parallelize_fn: ParallelizeFn | None = None
    # tp_plan_fn(model_part, *, styles, loss_parallel) -> {module name: ParallelStyle};
    # None: the spec does not support tensor parallelism (tp > 1 is a ConfigError).
    tp_plan_fn: Callable[..., Mapping[str, Any]] | None = None
    # Per-op selective activation checkpointing: ops whose outputs are saved
    # (activation_checkpoint.selective_save_ops replaces this list when set).
    selective_ac_save_ops: Sequence[str] = ()
    pipelining_fn: Callable[..., Any] | None = None
    config_model: type[BaseModel] | None = None
    defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # validate_fn(model_args, *, parallelism, training, world_size) raises ConfigError for
    # layouts the model cannot take (e.g. tp not dividing the heads); runs before any process group.
    validate_fn: Callable[..., None] | None = None
    flops_per_token_fn: Callable[[Any, int], float] | None = None
    build_loss_fn: Callable[..., Any] | None = None
    build_tokenizer_fn: Callable[..., Tokenizer] | None = None
    build_dataloader_fn: Callable[..., Any] | None = None
    build_optimizers_fn: Callable[..., Any] | None = None
    build_lr_schedulers_fn: Callable[..., Any] | None = None
    build_metrics_processor_fn: Callable[..., Any] | None = None
    state_dict_adapter: Any | None = None
    plugin_api_version: str = PLUGIN_API_VERSION

    def resolved_parallelize_fn(self) -> ParallelizeFn:
        """``parallelize_fn``, or the default one built from ``tp_plan_fn`` and ``selective_ac_save_ops``."""
        if self.parallelize_fn is not None:
            return self.parallelize_fn
        from .parallel.default import default_parallelize_fn

        return default_parallelize_fn(self.tp_plan_fn, selective_save_ops=self.selective_ac_save_ops,
                                      spec_name=f"spec {self.name}")

    def model_args(self, flavor: str, section: BaseModel | None, vocab_size: int | None) -> Any:
        """The flavor's args with the spec section's non-None fields and the vocab applied."""
        args = self.flavors[flavor]
        overrides: dict[str, Any] = {}
        if section is not None:
            overrides = {k: v for k, v in section.model_dump().items() if v is not None}
        names = {f.name for f in dataclasses.fields(args)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise TypeError(f"spec {self.name!r}: config fields {unknown} are not fields of {type(args).__name__}")
        if vocab_size is not None and "vocab_size" in names and getattr(args, "vocab_size") is None \
                and "vocab_size" not in overrides:
            overrides["vocab_size"] = vocab_size
        return dataclasses.replace(args, **overrides)


class EmptyConfig(BaseModel):
    """The config of a converter that has no options."""

    model_config = ConfigDict(extra="forbid")


class ModelConverter(abc.ABC):
    """Base class of a converter plugin (low precision, fused kernels, ...).

    Lifecycle, all on the meta-device model before any parallelism:
      ``__init__`` (raise ``TitanError`` when hardware or settings cannot support it)
      -> ``compatible_with(spec)`` -> ``select(model)`` -> the core resolves overlaps
      between converters (the converter named later wins) -> ``convert(model, fqns)``.
    ``pre_optimizer_hook`` / ``post_optimizer_hook`` run around every optimizer step.
    ``Config`` is the pydantic model of the converter's section, which is named after
    its entry point (``[float8]``, ``[mx]``).
    """

    Config: ClassVar[type[BaseModel]] = EmptyConfig
    plugin_api_version: ClassVar[str] = PLUGIN_API_VERSION
    prototype: ClassVar[bool] = False

    def __init__(self, config: BaseModel | Mapping[str, Any], *, parallel_dims: "ParallelDims", job: RunContext) -> None:
        # The core passes a validated ``Config``; tests and notebooks may pass a dict.
        if not isinstance(config, self.Config):
            raw = config.model_dump() if isinstance(config, BaseModel) else dict(config)
            config = self.Config.model_validate(raw)
        self.config = config
        self.parallel_dims = parallel_dims
        self.job = job

    def compatible_with(self, spec: TrainSpec) -> None:
        """Raise ``TitanError`` for a spec this converter cannot serve."""

    @abc.abstractmethod
    def select(self, model: nn.Module) -> list[str]:
        """Fully qualified names of the modules this converter would convert."""

    @abc.abstractmethod
    def convert(self, model: nn.Module, fqns: list[str]) -> None:
        """Rewrite exactly the modules named in ``fqns``, in place (meta device)."""

    def selection_keys(self) -> list[str]:
        """Field names of ``Config`` that change the selection (e.g. ``["fqns", "filter_fqns"]``).

        The core prefixes them with the section name (``float8.fqns``) in its errors.
        """
        return []

    def tensor_parallel_styles(self) -> TensorParallelStyles | None:
        """TP styles this converter needs for its modules, or None for torch's defaults."""
        return None

    def pre_optimizer_hook(self, model_parts: list[nn.Module]) -> None:
        """Called before every optimizer step."""

    def post_optimizer_hook(self, model_parts: list[nn.Module]) -> None:
        """Called after every optimizer step."""

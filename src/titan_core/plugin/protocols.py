"""The two plugin contracts: TrainSpec (a model) and ModelConverter (a model rewrite).

A plugin imports only ``titan_core``'s public API. Everything a plugin receives
is a narrow, validated slice of the job config, never the whole of it.
"""

from __future__ import annotations

import abc
import dataclasses
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, cast

import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from .._version import PLUGIN_API_VERSION
from ..errors import ConfigError, PluginError
from .resolved import MixedPrecision, promised_parallelism, resolve_mixed_precision
from .spec_factories import (
    BuildDataloaderFn,
    BuildLossFn,
    BuildLRSchedulersFn,
    BuildMetricsProcessorFn,
    BuildOptimizersFn,
    BuildTokenizerFn,
    FlopsPerTokenFn,
    ParallelizeFn,
    PipeliningFn,
    StateDictAdapter,
    TensorParallelPlanFn,
    TensorParallelStyles,
    Tokenizer,
    ValidateFn,
)

if TYPE_CHECKING:
    from ..config.parallel_dims import ParallelDims
    from ..config.sections import CompileSection, ParallelismSection, TrainingSection

# Re-exported: the contracts were first declared here, and plugins import them from here.
__all__ = [
    "EmptyConfig",
    "ModelConverter",
    "ParallelizeFn",
    "RunContext",
    "TensorParallelStyles",
    "Tokenizer",
    "TrainSpec",
]


class SectionFieldError(PluginError, TypeError):
    """A spec's config section sets a field its flavor dataclass lacks (a bug in the plugin). A TypeError, as
    it always was, and a PluginError, so the CLI prints one paragraph (exit code 2) instead of a traceback."""


@dataclass(frozen=True)
class RunContext:
    """The read-only facts about this run that a plugin may need besides its own section.

    ``parallelism`` holds only values plugin API 1.0 documented (``param_dtype`` is "float32" or
    "bfloat16", never "auto"). ``precision`` (API 1.1) is the run's dtypes resolved; built from the
    other fields when not given, so ``RunContext(device, backend, training, parallelism, compile)``
    still works.
    """

    device: torch.device
    backend: str  # the process-group backend, resolved ("gloo", "nccl"; never "auto")
    training: TrainingSection
    parallelism: ParallelismSection
    compile: CompileSection
    precision: MixedPrecision | None = None  # never None once constructed

    def __post_init__(self) -> None:  # frozen: each field is set once, here
        p = self.parallelism
        if self.precision is None:
            object.__setattr__(self, "precision", resolve_mixed_precision(
                dtype=self.training.dtype, param_dtype=p.param_dtype, reduce_dtype=p.reduce_dtype, device=self.device))
        assert self.precision is not None
        object.__setattr__(self, "parallelism", promised_parallelism(p, self.precision))


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
        previous stage's output;
      * ``forward(tokens, positions=...)`` (optional, needed by ``data.document_masking``):
        ``positions`` int [b, s] restart at 0 at each document of a packed row; the model
        attends only within a document and uses them for its position encoding. With
        pipelining (``pipeline_takes_positions=True``) every stage receives them, its first
        argument being the previous stage's output.
    Factories, when given, are called as the defaults are; each field's type is a Protocol
    in ``titan_core.plugin.spec_factories`` that states the call and what is done with the result
    (``BuildOptimizersFn``: default ``OptimizersContainer``; ``BuildLRSchedulersFn``:
    ``LRSchedulersContainer``; ``BuildMetricsProcessorFn``: ``MetricsLogger``; ``BuildLossFn``:
    ``cross_entropy_loss``; ``BuildTokenizerFn``: ``build_tokenizer(data.tokenizer)``;
    ``BuildDataloaderFn``: ``build_dataloader``). ``state_dict_adapter`` (optional, a
    ``titan_core.StateDictAdapter``) maps the model to the Hugging Face format; the core uses it for
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
    # None: the spec does not support tensor parallelism (tp > 1 is a ConfigError).
    tp_plan_fn: TensorParallelPlanFn | None = None
    # Per-op selective activation checkpointing: ops whose outputs are saved
    # (activation_checkpoint.selective_save_ops replaces this list when set).
    selective_ac_save_ops: Sequence[str] = ()
    # None: the spec does not support pipeline parallelism (pp > 1 is a ConfigError).
    pipelining_fn: PipeliningFn | None = None
    # True: every stage the pipelining_fn builds accepts ``positions=`` in its forward. With
    # data.document_masking the core then passes them to ``schedule.step`` on every rank, and
    # torch's schedules hand keyword arguments to every stage (activations alone would lose them).
    # False: data.document_masking with pp > 1 is a ConfigError.
    pipeline_takes_positions: bool = False
    config_model: type[BaseModel] | None = None
    defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # Raises ConfigError for layouts the model cannot take (e.g. tp not dividing the heads).
    validate_fn: ValidateFn | None = None
    # Called with the keywords it accepts (plugin_boundary.py): one without full_attention (written
    # before it existed) still works, its one count used for both figures.
    flops_per_token_fn: FlopsPerTokenFn | Callable[..., float] | None = None
    build_loss_fn: BuildLossFn | None = None
    build_tokenizer_fn: BuildTokenizerFn | None = None
    build_dataloader_fn: BuildDataloaderFn | None = None
    build_optimizers_fn: BuildOptimizersFn | None = None
    build_lr_schedulers_fn: BuildLRSchedulersFn | None = None
    build_metrics_processor_fn: BuildMetricsProcessorFn | None = None
    state_dict_adapter: StateDictAdapter | None = None
    plugin_api_version: str = PLUGIN_API_VERSION

    def model_args(self, flavor: str, section: BaseModel | None, vocab_size: int | None) -> Any:
        """The flavor's args with the spec section's non-None fields and the vocab applied."""
        args = self.flavors[flavor]
        overrides: dict[str, Any] = {}
        if section is not None:
            overrides = {k: v for k, v in section.model_dump().items() if v is not None}
        names = {f.name for f in dataclasses.fields(args)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise SectionFieldError(
                f"spec {self.name!r}: its config section [{self.name}] sets {unknown}, which are not fields of its "
                f"flavor dataclass {type(args).__name__}, so their values cannot reach the model. The plugin's "
                f"config_model and its flavors disagree: report it to the plugin's authors; meanwhile leave "
                f"{', '.join(f'{self.name}.{k}' for k in unknown)} unset.")
        if vocab_size is not None and "vocab_size" in names and args.vocab_size is None \
                and "vocab_size" not in overrides:
            overrides["vocab_size"] = vocab_size
        try:
            return dataclasses.replace(args, **overrides)
        except ValueError as exc:  # the args' own checks (__post_init__) refused the section's values
            raise ConfigError(f"the [{self.name}] settings do not fit flavor {flavor!r}: {exc}. Change the "
                              f"{self.name}.* values (or pick another flavor).") from None


class EmptyConfig(BaseModel):
    """The config of a converter that has no options."""

    model_config = ConfigDict(extra="forbid")


ConfigT = TypeVar("ConfigT", bound=BaseModel)


class ModelConverter(abc.ABC, Generic[ConfigT]):
    """Base class of a converter plugin (low precision, fused kernels, ...).

    Lifecycle, all on the meta-device model before any parallelism:
      ``__init__`` (validates the section, then calls ``setup()``: override that, not the
      constructor, and raise ``TitanError`` there when hardware or settings cannot support it)
      -> ``compatible_with(spec)`` -> ``select(model)`` -> the core resolves overlaps
      between converters (the converter named later wins) -> ``convert(model, fqns)``.
    ``pre_optimizer_hook`` / ``post_optimizer_hook`` run around every optimizer step.

    The converter's section (named after its entry point: ``[float8]``, ``[mx]``) is a
    pydantic model given once, as the type argument::

        class Int8Converter(ModelConverter[Int8Config]): ...

    which sets ``Config`` (the model the core validates the section with) and types
    ``self.config`` as ``Int8Config``. A converter that subclasses plain
    ``ModelConverter`` and sets ``Config = Int8Config`` works as before.
    """

    Config: ClassVar[type[BaseModel]] = EmptyConfig
    plugin_api_version: ClassVar[str] = PLUGIN_API_VERSION
    prototype: ClassVar[bool] = False
    config: ConfigT

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declared = _config_type_argument(cls)
        if declared is None:
            return
        own = cls.__dict__.get("Config")
        if own is not None and own is not declared:
            raise TypeError(
                f"{cls.__qualname__} subclasses ModelConverter[{declared.__name__}] but sets Config = "
                f"{getattr(own, '__name__', own)!s}; give the config once, as the type argument (drop Config)."
            )
        cls.Config = declared

    def __init__(self, config: ConfigT | BaseModel | Mapping[str, Any], *, parallel_dims: ParallelDims,
                 job: RunContext) -> None:
        # The core passes a validated ``Config``; tests and notebooks may pass a dict.
        if not isinstance(config, self.Config):
            raw = config.model_dump() if isinstance(config, BaseModel) else dict(config)
            config = self.Config.model_validate(raw)
        self.config = cast(ConfigT, config)  # an instance of Config, which is ConfigT
        self.parallel_dims = parallel_dims
        self.job = job
        self.setup()

    def setup(self) -> None:  # noqa: B027
        """Check the hardware and settings and prepare what the other calls need.

        Called once at the end of ``__init__``, with ``self.config`` (validated), ``self.parallel_dims``
        and ``self.job`` set, so a converter has no constructor signature to repeat. Raise
        ``TitanError`` (what is wrong, how to fix it) when the run cannot work.
        """

    def compatible_with(self, spec: TrainSpec) -> None:  # noqa: B027
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

    # Optional hooks: not abstract, and the core registers only the ones a converter overrides.
    def pre_optimizer_hook(self, model_parts: list[nn.Module]) -> None:  # noqa: B027
        """Called before every optimizer step."""

    def post_optimizer_hook(self, model_parts: list[nn.Module]) -> None:  # noqa: B027
        """Called after every optimizer step."""


def _config_type_argument(cls: type) -> type[BaseModel] | None:
    """``X`` when ``cls`` is declared as ``class C(ModelConverter[X])``; None when it names no
    config type (plain ``ModelConverter``, ``ModelConverter[Any]``, or a generic intermediate base
    with a type variable): ``Config`` is then set or inherited as before."""
    for base in cls.__dict__.get("__orig_bases__", ()):
        origin = typing.get_origin(base)
        if not (isinstance(origin, type) and issubclass(origin, ModelConverter)):
            continue
        args = typing.get_args(base)
        if not args or isinstance(args[0], TypeVar) or args[0] is Any:
            return None
        arg = args[0]
        if not (isinstance(arg, type) and issubclass(arg, BaseModel)):
            raise TypeError(
                f"{cls.__qualname__} subclasses ModelConverter[{arg!r}]: the type argument must be the "
                f"converter's config, a pydantic BaseModel subclass."
            )
        return arg
    return None

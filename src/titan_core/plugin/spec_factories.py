"""The signatures of a TrainSpec's factories, as Protocols a type checker can hold a plugin to.

Each Protocol states how the core calls the factory (the arguments, by keyword where
the core passes them by keyword) and what the core does with its result, so a plugin
that returns its own optimizer, loader or metrics object knows exactly what that
object must offer. The core's defaults satisfy them: ``OptimizersContainer``,
``LRSchedulersContainer``, ``MetricsLogger``, ``build_dataloader``, ``cross_entropy_loss``,
``titan_core.parallel.default_parallelize_fn``.

Heavy types (DTensor styles, the config sections) are imported for type checking
only: this module is imported by ``titan-train --list``, which must stay cheap.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import torch
from torch import nn

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ParallelStyle

    from ..config.parallel_dims import ParallelDims
    from ..config.sections import (
        ActivationCheckpointSection,
        CompileSection,
        DataSection,
        LRSchedulerSection,
        MetricsSection,
        OptimizerSection,
        ParallelismSection,
        TrainingSection,
    )


# ---- the tokenizer ----------------------------------------------------------------------------


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


@runtime_checkable
class BatchEncoder(Protocol):
    """Optional: a tokenizer that encodes many documents in one call (the data code packs
    documents through it when present, else calls ``encode`` per document)."""

    def encode_batch(self, texts: list[str], *, num_threads: int = 4) -> list[list[int]]:
        """Each text as ordinary text (no BOS/EOS), in order."""
        ...


@runtime_checkable
class Fingerprinted(Protocol):
    """Optional: a tokenizer that names its vocabulary (ranks, specials, split pattern) in a
    short string. Token streams are cached per process under it; without one the cache is
    keyed on the tokenizer object itself."""

    @property
    def fingerprint(self) -> str: ...


# ---- what the factories return ----------------------------------------------------------------


class LossFn(Protocol):
    """``loss(logits, labels)``: a scalar mean over the valid tokens of one micro-batch (labels
    equal to ``titan_core.IGNORE_INDEX``, -100, do not count); the trainer weights it by the
    micro-batch's share of the step's valid tokens."""

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor, /) -> torch.Tensor: ...


class DataLoader(Protocol):
    """Batches of ``(inputs, labels)``, restartable (``reset``) and checkpointed (state dict)."""

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...
    def reset(self) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any], /) -> None: ...


class LRSchedulers(Protocol):
    """Steps every optimizer's learning rate together, once per training step."""

    def step(self) -> None: ...
    def get_last_lr(self) -> float: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state_dict: dict[str, Any], /) -> None: ...


class MetricsProcessor(Protocol):
    """Records training and validation metrics (rank 0 writes ``path``, a JSON-lines file)."""

    @property
    def path(self) -> Path: ...
    def should_log(self, step: int, *, last: bool) -> bool: ...
    def log_step(
        self, *, step: int, loss: float, grad_norm: float, lr: float, tokens: float, step_time: float,
        extra: dict[str, float],
    ) -> dict[str, float]: ...
    def log_validation(self, *, step: int, loss: float) -> None: ...
    def close(self) -> None: ...


class Pipeline(Protocol):
    """This rank's pipeline stages and the schedule that runs them (``pipelining_fn``'s result)."""

    @property
    def schedule(self) -> Any: ...  # a torch.distributed.pipelining schedule
    @property
    def model_parts(self) -> list[nn.Module]: ...
    @property
    def has_first_stage(self) -> bool: ...
    @property
    def has_last_stage(self) -> bool: ...


# ---- the factories ----------------------------------------------------------------------------


class ParallelizeFn(Protocol):
    """Applies TP -> activation checkpointing -> compile -> FSDP2 to one model part, in place.

    ``mesh`` is the full named DeviceMesh (dims ``pp``, ``dp_replicate``, ``dp_shard``,
    ``tp`` and the flattened ``dp``), or None in a single-process run.
    """

    def __call__(
        self,
        model: nn.Module,
        *,
        parallel_dims: ParallelDims,
        mesh: DeviceMesh | None,
        training: TrainingSection,
        parallelism: ParallelismSection,
        compile: CompileSection,
        activation_checkpoint: ActivationCheckpointSection,
        tp_styles: TensorParallelStyles,
    ) -> nn.Module: ...


class TensorParallelPlanFn(Protocol):
    """Returns the TP plan of one model part: ``{module name relative to it: ParallelStyle}``.

    ``styles`` holds the ParallelStyle classes to use for linears (torch's, or a
    converter's such as float8's); ``loss_parallel`` says whether the head must
    leave its logits as a vocabulary-sharded DTensor (``Shard(-1)``).
    """

    def __call__(
        self, model: nn.Module, *, styles: TensorParallelStyles, loss_parallel: bool
    ) -> Mapping[str, ParallelStyle]: ...


class PipeliningFn(Protocol):
    """Splits the meta model into this rank's stages, calls ``parallelize`` on each, builds the schedule.

    ``loss_fn`` is the per-micro-batch loss the schedule must use on the last stage.
    """

    def __call__(
        self,
        model: nn.Module,
        *,
        parallel_dims: ParallelDims,
        mesh: DeviceMesh | None,
        parallelism: ParallelismSection,
        training: TrainingSection,
        device: torch.device,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        parallelize: Callable[[nn.Module], nn.Module],
    ) -> Pipeline: ...


class ValidateFn(Protocol):
    """Raises ``ConfigError`` for a layout the model cannot take (runs before any process group)."""

    def __call__(
        self, model_args: Any, /, *, parallelism: ParallelismSection, training: TrainingSection, world_size: int
    ) -> None: ...


class FlopsPerTokenFn(Protocol):
    """Training FLOPs per token at ``seq_len``. ``full_attention=False`` counts attention as the
    kernel computes it (causal: about half the square), ``True`` the full square. Like every plugin
    function, it is called with the keywords it accepts: one written without ``full_attention``
    gives one count, used for both."""

    def __call__(self, model_args: Any, seq_len: int, /, *, full_attention: bool) -> float: ...


# Plugin API 1.0 exported this name (a flops_per_token_fn without ``full_attention``); removed by mistake
# without a major version, it is served again, deprecated (docs/plugins.md, "Versions").
_DEPRECATED = {"LegacyFlopsPerTokenFn": ("1.1", "FlopsPerTokenFn; a function without full_attention is still "
                                                "accepted, its one count used for both figures")}
if TYPE_CHECKING:
    LegacyFlopsPerTokenFn = Callable[[Any, int], float]


def __getattr__(name: str) -> Any:
    if name not in _DEPRECATED:
        raise AttributeError(f"module 'titan_core.spec_factories' has no attribute {name!r}")
    since, instead = _DEPRECATED[name]
    warnings.warn(f"{name} is deprecated since titan-core plugin API {since}; use {instead}.", DeprecationWarning,
                  stacklevel=2)
    return Callable[[Any, int], float]


class BuildLossFn(Protocol):
    """Returns the loss function (default: ``titan_core.cross_entropy_loss``)."""

    def __call__(self) -> LossFn: ...


class BuildTokenizerFn(Protocol):
    """Builds the tokenizer from the ``[data]`` section (default: ``titan_core.build_tokenizer(data.tokenizer)``)."""

    def __call__(self, data: DataSection, /) -> Tokenizer: ...


class BuildDataloaderFn(Protocol):
    """Builds one split's loader; called with ``titan_core.build_dataloader``'s keywords."""

    def __call__(
        self,
        *,
        source: str,
        tokenizer: Tokenizer,
        seq_len: int,
        local_batch_size: int,
        dp_rank: int,
        dp_world_size: int,
        seed: int,
        split: Literal["train", "validation"],
        val_fraction: float,
        text_field: str,
        hf_split: str,
        allow_download: bool,
    ) -> DataLoader: ...


class BuildOptimizersFn(Protocol):
    """One optimizer over every model part (default: ``OptimizersContainer``)."""

    def __call__(
        self, model_parts: list[nn.Module], config: OptimizerSection, /, *, device_type: str
    ) -> torch.optim.Optimizer: ...


class BuildLRSchedulersFn(Protocol):
    """The learning-rate schedule of ``optimizer`` (default: ``LRSchedulersContainer``)."""

    def __call__(
        self, optimizer: torch.optim.Optimizer, config: LRSchedulerSection, /, *, total_steps: int
    ) -> LRSchedulers: ...


class BuildMetricsProcessorFn(Protocol):
    """The metrics recorder (default: ``MetricsLogger``)."""

    def __call__(
        self,
        config: MetricsSection,
        /,
        *,
        run_dir: Path,
        is_rank0: bool,
        device: torch.device,
        flops_per_token: FlopsPerToken | None,
        world_size: int,
        run_config: dict[str, Any] | None,
    ) -> MetricsProcessor: ...


__all__ = [
    "BatchEncoder",
    "BuildDataloaderFn",
    "BuildLRSchedulersFn",
    "BuildLossFn",
    "BuildMetricsProcessorFn",
    "BuildOptimizersFn",
    "BuildTokenizerFn",
    "DataLoader",
    "Fingerprinted",
    "FlopsPerTokenFn",
    "LRSchedulers",
    "LossFn",
    "MetricsProcessor",
    "ParallelizeFn",
    "Pipeline",
    "PipeliningFn",
    "TensorParallelPlanFn",
    "Tokenizer",
    "ValidateFn",
]


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
    def default() -> TensorParallelStyles:
        from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel

        return TensorParallelStyles(ColwiseParallel, RowwiseParallel, PrepareModuleInput)


@dataclass(frozen=True)
class FlopsPerToken:
    """Training FLOPs per token two ways: attention as the kernel computes it (causal: about half
    the square; what MFU uses, so it cannot exceed 1 at the true peak) and over the full square
    (the custom of published MFU figures, shown beside it for comparison)."""

    computed: float
    full_attention: float


@runtime_checkable
class StateDictAdapter(Protocol):
    """What ``TrainSpec.state_dict_adapter`` provides (see the module docstring)."""

    runtime_fields: tuple[str, ...]

    def model_args_from_hf(self, config: Mapping[str, Any]) -> Any: ...
    def hf_config(self, model_args: Any) -> dict[str, Any]: ...
    def from_hf(self, state_dict: Mapping[str, torch.Tensor], model_args: Any) -> dict[str, torch.Tensor]: ...
    def to_hf(self, state_dict: Mapping[str, torch.Tensor], model_args: Any) -> dict[str, torch.Tensor]: ...
    # Optional (not part of the runtime check): def from_hf_rows(self, hf_key, hf_shape, model_args)
    #   -> torch.Tensor | None; see the module docstring and row_map().

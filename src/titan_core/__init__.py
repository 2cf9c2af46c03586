"""titan-core: the shared LLM pre-training runtime; models and converters are plugins.

The public API is ``__all__``. Names are loaded lazily, so ``titan-train --list``
and ``--help`` never pay for torch, datasets or tiktoken until something needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import PLUGIN_API_VERSION, __version__

# public name -> module that defines it
_LAZY: dict[str, str] = {
    "TitanError": "errors",
    "ConfigError": "errors",
    "PluginError": "errors",
    "CheckpointError": "errors",
    "NonFiniteError": "errors",
    "TrainSpec": "protocols",
    "ModelConverter": "protocols",
    "EmptyConfig": "protocols",
    "RunContext": "protocols",
    "TensorParallelStyles": "protocols",
    "Tokenizer": "protocols",
    "BatchEncoder": "spec_factories",
    "BuildDataloaderFn": "spec_factories",
    "BuildLRSchedulersFn": "spec_factories",
    "BuildLossFn": "spec_factories",
    "BuildMetricsProcessorFn": "spec_factories",
    "BuildOptimizersFn": "spec_factories",
    "BuildTokenizerFn": "spec_factories",
    "DataLoader": "spec_factories",
    "Fingerprinted": "spec_factories",
    "FlopsPerTokenFn": "spec_factories",
    "LRSchedulers": "spec_factories",
    "LossFn": "spec_factories",
    "MetricsProcessor": "spec_factories",
    "ParallelizeFn": "spec_factories",
    "Pipeline": "spec_factories",
    "PipeliningFn": "spec_factories",
    "TensorParallelPlanFn": "spec_factories",
    "ValidateFn": "spec_factories",
    "ParallelDims": "parallel_dims",
    "register_train_spec": "discovery",
    "register_model_converter": "discovery",
    "JobConfig": "config.job",
    "ActivationCheckpointSection": "config.sections",
    "CheckpointSection": "config.sections",
    "CompileSection": "config.sections",
    "DataSection": "config.sections",
    "LRSchedulerSection": "config.sections",
    "MetricsSection": "config.sections",
    "ModelSection": "config.sections",
    "OptimizerSection": "config.sections",
    "ParallelismSection": "config.sections",
    "TrainingSection": "config.sections",
    "OptimizersContainer": "optim",
    "LRSchedulersContainer": "optim",
    "Trainer": "trainer",
    "cross_entropy_loss": "loss",
    "TiktokenTokenizer": "tokenizer",
    "build_tokenizer": "tokenizer",
    "build_dataloader": "data",
    "init_model_weights": "init",
    "retie_weights": "ties",
    "declared_ties": "ties",
    "check_ties": "ties",
    "StateDictAdapter": "hf.adapter",
    "parameter_generator": "init",
    "MetricsLogger": "metrics",
    "CheckpointManager": "checkpoint",
    "RunIdentity": "checkpoint",
    "ResumeInfo": "checkpoint",
    "collect_param_shapes": "checkpoint",
    "export_safetensors": "checkpoint",
    "read_checkpoint_tensors": "checkpoint",
    "fqn_matches": "selection",
    "select_linears": "selection",
    "ConversionTable": "converters",
    "apply_converters": "converters",
    "acquire_run_lock": "run_lock",
    "RunFolderBusy": "run_lock",
    "StopRequested": "signals",
    "PeerLost": "peer_failure",
    "default_parallelize_fn": "parallel",
}

__all__ = ["PLUGIN_API_VERSION", "__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'titan_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:
    from .checkpoint import (
        CheckpointManager,
        ResumeInfo,
        RunIdentity,
        collect_param_shapes,
        export_safetensors,
        read_checkpoint_tensors,
    )
    from .config.job import JobConfig
    from .converters import ConversionTable, apply_converters
    from .parallel import default_parallelize_fn
    from .config.sections import (
        ActivationCheckpointSection,
        CheckpointSection,
        CompileSection,
        DataSection,
        LRSchedulerSection,
        MetricsSection,
        ModelSection,
        OptimizerSection,
        ParallelismSection,
        TrainingSection,
    )
    from .data import build_dataloader
    from .discovery import register_model_converter, register_train_spec
    from .errors import CheckpointError, ConfigError, NonFiniteError, PluginError, TitanError
    from .init import init_model_weights, parameter_generator
    from .hf.adapter import StateDictAdapter
    from .ties import check_ties, declared_ties, retie_weights
    from .loss import cross_entropy_loss
    from .metrics import MetricsLogger
    from .optim import LRSchedulersContainer, OptimizersContainer
    from .parallel_dims import ParallelDims
    from .selection import fqn_matches, select_linears
    from .protocols import EmptyConfig, ModelConverter, RunContext, TensorParallelStyles, TrainSpec, Tokenizer
    from .spec_factories import (
        BatchEncoder,
        BuildDataloaderFn,
        BuildLRSchedulersFn,
        BuildLossFn,
        BuildMetricsProcessorFn,
        BuildOptimizersFn,
        BuildTokenizerFn,
        DataLoader,
        Fingerprinted,
        FlopsPerTokenFn,
        LRSchedulers,
        LossFn,
        MetricsProcessor,
        ParallelizeFn,
        Pipeline,
        PipeliningFn,
        TensorParallelPlanFn,
        ValidateFn,
    )
    from .tokenizer import TiktokenTokenizer, build_tokenizer
    from .trainer import Trainer

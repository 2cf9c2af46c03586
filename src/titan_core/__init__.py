"""titan-core: the shared LLM pre-training runtime; models and converters are plugins.

The public API is ``__all__``. Names are loaded lazily, so ``titan-train --list``
and ``--help`` never pay for torch, datasets or tiktoken until something needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import _moved
from ._version import PLUGIN_API_VERSION, __version__
from .runtime.torch_floor import require_torch_floor

# A torch older than the floor ends the process here (one message, exit 2), not in a traceback later.
require_torch_floor()

_moved.install()  # old import paths of modules that moved into packages keep working (docs/plugins.md)


def _lazy_table() -> dict[str, str]:
    """public name -> the module that defines it, read from the ``TYPE_CHECKING`` imports below: the
    one list of public names, which type checkers read as the package's re-exports."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    block = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    return {alias.asname or alias.name: (node.module or "") for node in block.body
            if isinstance(node, ast.ImportFrom) for alias in node.names}


_LAZY = _lazy_table()

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
    # "X as X": the explicit re-export form, so type checkers see the lazy names as public.
    from .checkpoint import (
        CheckpointManager as CheckpointManager,
        ResumeInfo as ResumeInfo,
        RunIdentity as RunIdentity,
        collect_param_shapes as collect_param_shapes,
        export_safetensors as export_safetensors,
        read_checkpoint_tensors as read_checkpoint_tensors,
    )
    from .commands.titan_train import main as main
    from .config.job import JobConfig as JobConfig
    from .config.parallel_dims import ParallelDims as ParallelDims
    from .config.sections import (
        ActivationCheckpointSection as ActivationCheckpointSection,
        CheckpointSection as CheckpointSection,
        CompileSection as CompileSection,
        DataSection as DataSection,
        LRSchedulerSection as LRSchedulerSection,
        MetricsSection as MetricsSection,
        ModelSection as ModelSection,
        OptimizerSection as OptimizerSection,
        ParallelismSection as ParallelismSection,
        TrainingSection as TrainingSection,
    )
    from .data import build_dataloader as build_dataloader
    from .data.documents import split_documents as split_documents
    from .data.tokenizer import TiktokenTokenizer as TiktokenTokenizer
    from .errors import (
        CheckpointError as CheckpointError,
        ConfigError as ConfigError,
        NonFiniteError as NonFiniteError,
        PeerLost as PeerLost,
        PluginError as PluginError,
        RunFolderBusy as RunFolderBusy,
        StopRequested as StopRequested,
        TitanError as TitanError,
    )
    from .models.init import (
        init_model_weights as init_model_weights,
        parameter_generator as parameter_generator,
    )
    from .models.kv_cache import KVCache as KVCache
    from .models.loss import IGNORE_INDEX as IGNORE_INDEX, cross_entropy_loss as cross_entropy_loss
    from .models.sampling import Sampling as Sampling, sample as sample
    from .models.ties import (
        check_ties as check_ties,
        declared_ties as declared_ties,
        retie_weights as retie_weights,
    )
    from .moe import (
        GroupedExperts as GroupedExperts,
        MoE as MoE,
        MoEMonitor as MoEMonitor,
        TopKRouter as TopKRouter,
    )
    from .observability.metrics import MetricsLogger as MetricsLogger
    from .observability.report import write_run_report as write_run_report
    from .optim.containers import (
        LRSchedulersContainer as LRSchedulersContainer,
        OptimizersContainer as OptimizersContainer,
    )
    from .parallel import default_parallelize_fn as default_parallelize_fn
    from .plan.tokenizer import build_tokenizer as build_tokenizer
    from .plugin.discovery import (
        register_model_converter as register_model_converter,
        register_train_spec as register_train_spec,
    )
    from .plugin.protocols import (
        EmptyConfig as EmptyConfig,
        ModelConverter as ModelConverter,
        RunContext as RunContext,
        TensorParallelStyles as TensorParallelStyles,
        Tokenizer as Tokenizer,
        TrainSpec as TrainSpec,
    )
    from .plugin.selection import (
        fqn_matches as fqn_matches,
        select_linears as select_linears,
        select_modules as select_modules,
    )
    from .plugin.spec_factories import (
        BatchEncoder as BatchEncoder,
        BuildDataloaderFn as BuildDataloaderFn,
        BuildLossFn as BuildLossFn,
        BuildLRSchedulersFn as BuildLRSchedulersFn,
        BuildMetricsProcessorFn as BuildMetricsProcessorFn,
        BuildOptimizersFn as BuildOptimizersFn,
        BuildTokenizerFn as BuildTokenizerFn,
        DataLoader as DataLoader,
        Fingerprinted as Fingerprinted,
        FlopsPerTokenFn as FlopsPerTokenFn,
        LossFn as LossFn,
        LRSchedulers as LRSchedulers,
        MetricsProcessor as MetricsProcessor,
        ParallelizeFn as ParallelizeFn,
        Pipeline as Pipeline,
        PipeliningFn as PipeliningFn,
        StateDictAdapter as StateDictAdapter,
        TensorParallelPlanFn as TensorParallelPlanFn,
        ValidateFn as ValidateFn,
    )
    from .runtime.run_lock import acquire_run_lock as acquire_run_lock
    from .train.converters import (
        ConversionTable as ConversionTable,
        apply_converters as apply_converters,
    )
    from .train.trainer import Trainer as Trainer

"""Everything a titan-core plugin may receive and call: the plugin contract, version 1.3.

A plugin (a model's ``TrainSpec`` or a ``ModelConverter``, shipped as its own package and found
through an entry point) may rely on exactly the names in ``__all__`` here, and on what the
core hands its functions as stated below. ``docs/plugins.md`` ("Versions") is the policy:
a minor version only adds; a removal or a change of meaning is a new major version; a
deprecated name keeps working, with a ``DeprecationWarning``, for at least one minor version.
A plugin declares the version it was written for (``plugin_api_version``); discovery refuses
one this core cannot serve (another major, or a newer minor), naming both versions.

What the core passes (1.0 unless marked):

- ``parallelize_fn(model, *, parallel_dims, mesh, training, parallelism, compile,
  activation_checkpoint, tp_styles)``; 1.1 adds ``precision`` (``MixedPrecision``) and ``device``
  (``torch.device``). A keyword added after 1.0 is passed only to a function whose signature names
  it: a ``**kwargs`` catch-all does not count (a wrapper forwarding everything to a function written
  before the keyword existed would pass it on).
- ``pipelining_fn(model, *, parallel_dims, mesh, parallelism, training, device, loss_fn,
  parallelize)``; 1.1 adds ``precision``.
- ``validate_fn(model_args, *, parallelism, training, world_size)``; 1.1 adds ``precision`` and ``device``.
- ``tp_plan_fn(model, *, styles, loss_parallel)``; ``flops_per_token_fn(model_args, seq_len, *,
  full_attention)`` (a function without ``full_attention`` gets one call, its count used for both).
- ``build_tokenizer_fn(data)``, ``build_dataloader_fn(**build_dataloader's keywords)``,
  ``build_loss_fn()``, ``build_optimizers_fn(model_parts, optimizer, *, device_type)``,
  ``build_lr_schedulers_fn(optimizer, lr_scheduler, *, total_steps)``,
  ``build_metrics_processor_fn(metrics, *, run_dir, is_rank0, device, flops_per_token,
  world_size, run_config)``: ``run_config`` is the whole config as recorded (raw: it gains keys
  and values as the core grows; read it as a record, not as settings).
- A converter: ``__init__(config, *, parallel_dims, job)`` (the base class validates ``config``,
  then calls ``setup()``), ``compatible_with(spec)``, ``select(model)``, ``convert(model, fqns)``,
  ``selection_keys()``, ``tensor_parallel_styles()``, ``pre_/post_optimizer_hook(model_parts)``.
  ``job`` is a ``RunContext``: ``device`` and ``backend`` resolved; 1.1 adds ``precision``.
- A ``state_dict_adapter`` (``StateDictAdapter``): ``model_args_from_hf(config)``,
  ``hf_config(model_args)``, ``from_hf(state_dict, model_args)``, ``to_hf(state_dict, model_args)``.
- The model: ``model_cls(model_args)`` on the meta device, ``init_parameter(fqn, tensor,
  generator)``, optional ``init_buffers()`` and ``tied_weights()``, ``forward(tokens)`` (and
  ``positions=`` with document masking) returning ``[batch, seq, vocab]`` logits. 1.2 adds
  ``labels=`` (``[batch, seq]``, or None) to a forward that declares it, in training forwards that hold
  whole sequences (no pipeline, no context parallelism), and ``LossTerm``: a submodule through which
  the model adds its own term to the training loss (``titan_core.models.loss_terms``). 1.3 adds
  ``norms=(q_norm, k_norm)`` to ``titan_core.models.attention_logits.record_attention_logits`` for
  attention with QK-norm (QK-clip then scales the norm weights).

Values are resolved before a plugin sees them. The config sections passed hold only the
values their field documented when that field entered the contract: ``parallelism.param_dtype``
is ``"float32"`` or ``"bfloat16"`` (the config's ``"auto"``, added after 1.0, arrives as the dtype
it resolves to). Enumerations that were already open in 1.0 (``training.dtype`` and
``training.device`` may be ``"auto"``) stay as they were; new code should read ``precision`` and
``device``, which never hold a config string.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import _lazy_table, _load_lazily
from ._version import PLUGIN_API_VERSION

if TYPE_CHECKING:
    # "X as X": explicit re-exports; this block is the one list of public names (read by _lazy_table).
    from .config.parallel_dims import ParallelDims as ParallelDims
    from .config.sections import (
        ActivationCheckpointSection as ActivationCheckpointSection,
        CompileSection as CompileSection,
        DataSection as DataSection,
        LRSchedulerSection as LRSchedulerSection,
        MetricsSection as MetricsSection,
        OptimizerSection as OptimizerSection,
        ParallelismSection as ParallelismSection,
        TrainingSection as TrainingSection,
    )
    from .data import build_dataloader as build_dataloader
    from .errors import (
        ConfigError as ConfigError,
        PluginError as PluginError,
        TitanError as TitanError,
    )
    from .models.init import (
        init_model_weights as init_model_weights,
        parameter_generator as parameter_generator,
    )
    from .models.loss import (
        IGNORE_INDEX as IGNORE_INDEX,
        cross_entropy_loss as cross_entropy_loss,
    )
    from .models.loss_terms import LossTerm as LossTerm
    from .models.ties import (
        check_ties as check_ties,
        declared_ties as declared_ties,
        retie_weights as retie_weights,
    )
    from .moe import (
        GroupedExperts as GroupedExperts,
        MoE as MoE,
        TopKRouter as TopKRouter,
    )
    from .observability.metrics import MetricsLogger as MetricsLogger
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
        TrainSpec as TrainSpec,
    )
    from .plugin.resolved import MixedPrecision as MixedPrecision
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
        FlopsPerToken as FlopsPerToken,
        FlopsPerTokenFn as FlopsPerTokenFn,
        LegacyFlopsPerTokenFn as LegacyFlopsPerTokenFn,  # deprecated (below)
        LossFn as LossFn,
        LRSchedulers as LRSchedulers,
        MetricsProcessor as MetricsProcessor,
        ParallelizeFn as ParallelizeFn,
        Pipeline as Pipeline,
        PipeliningFn as PipeliningFn,
        StateDictAdapter as StateDictAdapter,
        TensorParallelPlanFn as TensorParallelPlanFn,
        Tokenizer as Tokenizer,
        ValidateFn as ValidateFn,
    )

# Deprecated names, still served with a DeprecationWarning (docs/plugins.md): name -> the module serving it.
_DEPRECATED: dict[str, str] = {"LegacyFlopsPerTokenFn": "plugin.spec_factories"}

# name -> the module that defines it, read from the block above; imported when first used, so importing a
# plugin stays cheap (``titan-train --list`` imports every plugin).
_WHERE = {name: module for name, module in _lazy_table(__file__).items() if name not in _DEPRECATED}

# Written out, for type checkers (``from .plugin_api import *`` in __init__); a test holds it to the block above.
__all__ = ["PLUGIN_API_VERSION", "ActivationCheckpointSection", "BatchEncoder", "BuildDataloaderFn",
           "BuildLRSchedulersFn", "BuildLossFn", "BuildMetricsProcessorFn", "BuildOptimizersFn",
           "BuildTokenizerFn", "CompileSection", "ConfigError", "DataLoader", "DataSection", "EmptyConfig",
           "Fingerprinted", "FlopsPerToken", "FlopsPerTokenFn", "GroupedExperts", "IGNORE_INDEX",
           "LRSchedulerSection", "LRSchedulers", "LRSchedulersContainer", "LossFn", "LossTerm", "MetricsLogger",
           "MetricsProcessor", "MetricsSection", "MixedPrecision", "MoE", "ModelConverter", "OptimizerSection",
           "OptimizersContainer", "ParallelDims", "ParallelismSection", "ParallelizeFn", "Pipeline",
           "PipeliningFn", "PluginError", "RunContext", "StateDictAdapter", "TensorParallelPlanFn",
           "TensorParallelStyles", "TitanError", "Tokenizer", "TopKRouter", "TrainSpec", "TrainingSection",
           "ValidateFn", "build_dataloader", "build_tokenizer", "check_ties", "cross_entropy_loss",
           "declared_ties", "default_parallelize_fn", "fqn_matches", "init_model_weights", "parameter_generator",
           "register_model_converter", "register_train_spec", "retie_weights", "select_linears", "select_modules"]


def __getattr__(name: str) -> Any:
    if name in _DEPRECATED:  # not cached here: each use warns (the serving module's __getattr__)
        return getattr(importlib.import_module(f"titan_core.{_DEPRECATED[name]}"), name)
    return _load_lazily(name, _WHERE, globals())


def __dir__() -> list[str]:
    return sorted(__all__)

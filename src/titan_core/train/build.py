"""The parts of a run, built from its resolved config by free functions.

The Trainer's set-up methods call these, and so do the paths that need some parts but
no training: ``--dry-run`` (model and converters on the meta device), the launcher's
preflight (the converters, before any worker starts) and the conformance kit. Each
takes the ``ResolvedConfig`` and the parts it builds on, and holds no state, so what a
dry run refuses is what the run refuses at the same step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..boundary.meta_model import meta_model
from ..boundary.plugin_boundary import ConverterCalls
from ..console import progress
from ..errors import ConfigError, PluginError
from ..models.ties import check_ties
from ..optim.containers import LRSchedulersContainer, OptimizersContainer
from ..optim.param_groups import rule_left_empty
from ..optim.settings import settings_checked
from ..plan.resolve import ResolvedConfig
from ..plugin.guard import plugin_label
from ..plugin.protocols import ModelConverter, RunContext, TensorParallelStyles
from .converters import ConversionTable, apply_converters, register_converter_hooks
from .memory_estimate import check_model_fits, local_ranks_from_env

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

NamedConverters = list[tuple[str, ModelConverter[Any]]]


@dataclass(frozen=True)
class MetaModel:
    """The model on the meta device, its declared ties (checked) and its parameter count."""

    model: nn.Module
    ties: list[tuple[str, str]]
    n_params: int


def build_meta_model(resolved: ResolvedConfig) -> MetaModel:
    """``spec.model_cls(model_args)`` on the meta device: no memory is used until the model is sharded."""
    model = meta_model(resolved.calls, resolved.model_args)
    check_buffers_recomputed(model, spec=resolved.spec.name)
    ties = resolved.calls.tied_weights(model)  # tied weights are checked after every set-up step
    check_ties([model], ties, after="the meta build")
    # Checked on the whole model, before a pipeline split leaves each rank only its own stage's parameters.
    if resolved.spec.build_optimizers_fn is None and resolved.config.optimizer.param_groups:
        empty = rule_left_empty(model, resolved.config.optimizer)
        if empty is not None:
            raise ConfigError(f"{empty}.")
    return MetaModel(model, ties, sum(p.numel() for p in model.parameters()))


def check_buffers_recomputed(model: nn.Module, *, spec: str) -> None:
    """PluginError for a model with buffers of its own and no ``init_buffers()``: ``to_empty`` leaves them holding
    whatever memory held (a causal mask came out 41% True, future tokens visible), and nothing recomputes them.
    Checked on the model as built, before converters add buffers of their own."""
    if callable(getattr(model, "init_buffers", None)):
        return
    names = [name for name, _ in model.named_buffers()]
    if names:
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        raise PluginError(
            f"{plugin_label('titan.train_specs', spec)}: model class {type(model).__name__} has buffers ({shown}) "
            f"but no init_buffers() method. The core builds the model on the meta device and gives it memory with "
            f"to_empty, so what the constructor computed into a buffer is lost and the buffer holds garbage; "
            f"define init_buffers() to recompute them (docs/writing-a-train-spec.md, section 4, \"The model "
            f"contract\"), or compute the values in forward.")


def check_parallelize_settings(resolved: ResolvedConfig, model: nn.Module) -> None:
    """What the spec's parallelize_fn would refuse, checked without applying it (the dry run): with the core's
    default one, a model whose blocks are not in ``model.layers``; per-op selective activation checkpointing with
    no op to save, or an op name this torch lacks. Run after the meta build, which has imported the model's
    modules (and any custom ops they register)."""
    from ..parallel.checkpointing import require_save_op_names, resolve_ops  # start-up: DTensor, seconds
    from ..parallel.default import model_blocks  # start-up: as above

    ac, spec = resolved.config.activation_checkpoint, resolved.spec
    if spec.parallelize_fn is None:
        model_blocks(model, spec_name=plugin_label("titan.train_specs", spec.name))
    if ac.mode != "selective" or ac.selective_every > 0:
        return
    if ac.selective_save_ops is not None:
        resolve_ops(ac.selective_save_ops)
    elif spec.parallelize_fn is None:  # the core's parallelize_fn: a spec's own may checkpoint its own way
        require_save_op_names(ac, spec.selective_ac_save_ops)


def announce_model(resolved: ResolvedConfig, n_params: int, *, is_rank0: bool) -> None:
    """The run log's line for the model (and, first, where its shape came from when not the flavor)."""
    progress(f"model {resolved.weights.model_label(resolved.spec.name)}: {n_params:,} parameters", is_rank0=is_rank0)


def check_fits(resolved: ResolvedConfig, n_params: int) -> None:
    """Refuse a model whose weights and optimizer state cannot fit on this machine's devices."""
    c = resolved.config
    p = c.parallelism
    # A dry run (before any launcher) counts the ranks the run would put on this machine.
    check_model_fits(n_params, optimizer=c.optimizer.name, dp_shard=resolved.dims.dp_shard, tp=p.tp, pp=p.pp,
                     device=resolved.device, local_ranks=local_ranks_from_env(default=resolved.world_size),
                     ema=c.ema.decay is not None)


def run_context(resolved: ResolvedConfig) -> RunContext:
    c = resolved.config
    return RunContext(resolved.device, resolved.backend, c.training, c.parallelism, c.compile, precision=resolved.precision)


def build_converters(resolved: ResolvedConfig) -> NamedConverters:
    """The requested converters, constructed in command-line order, each with its name."""
    ctx = run_context(resolved)
    return [(name, ConverterCalls.construct(name, cls, getattr(resolved.config, name), parallel_dims=resolved.dims,
                                            job=ctx).converter) for name, cls in resolved.converters]


def convert_model(resolved: ResolvedConfig, model: nn.Module, converters: NamedConverters) -> ConversionTable:
    """Select -> resolve overlaps (the converter named later wins) -> convert, in place, on meta."""
    return apply_converters(model, converters, resolved.spec)


def parallelize_part(resolved: ResolvedConfig, part: nn.Module, *, mesh: DeviceMesh | None,
                     tp_styles: TensorParallelStyles) -> nn.Module:
    """The spec's ``parallelize_fn`` on one model part: TP -> activation checkpointing -> compile -> FSDP2."""
    c = resolved.config
    return resolved.calls.parallelize(
        part, parallel_dims=resolved.dims, mesh=mesh, training=c.training, parallelism=resolved.plugin_parallelism,
        compile=c.compile, activation_checkpoint=c.activation_checkpoint, tp_styles=tp_styles,
        added={"precision": resolved.precision, "device": resolved.device},  # plugin API 1.1, to functions naming them
    )


def build_optimizers(resolved: ResolvedConfig, model_parts: list[nn.Module],
                     converters: NamedConverters) -> tuple[torch.optim.Optimizer, Any]:
    """(optimizer, LR schedulers): the spec's factories or the core's, with the converters' optimizer hooks."""
    c, calls, device_type = resolved.config, resolved.calls, resolved.device.type
    # The spec's own factories are plugin code (the facade names them); the core's fail as a settings error.
    optimizer = calls.optimizers(model_parts, c.optimizer, device_type=device_type)
    if optimizer is None:
        with settings_checked("optimizer", c.optimizer, what=f"torch.optim.{c.optimizer.name}"):
            optimizer = OptimizersContainer(model_parts, c.optimizer, device_type=device_type)
    lr_schedulers = calls.lr_schedulers(optimizer, c.lr_scheduler, total_steps=c.training.steps)
    if lr_schedulers is None:
        with settings_checked("lr_scheduler", c.lr_scheduler, what="the LR scheduler"):
            lr_schedulers = LRSchedulersContainer(optimizer, c.lr_scheduler, total_steps=c.training.steps)
    register_converter_hooks(optimizer, converters, model_parts)
    return optimizer, lr_schedulers

"""The default ``parallelize_fn``: a spec's TP plan, then AC, compile and FSDP2, in that fixed order.

Everything runs on the meta device, before ``to_empty`` and weight init, on either
the whole model or one pipeline stage of it. No step renames a parameter, so
checkpoints and the per-parameter init seeds do not depend on the layout.

The order is fixed, and each step assumes the previous ones:
  1. TP shards the modules the plan names (parameters become DTensors on ``mesh["tp"]``);
     ETP (``parallelism.etp``) splits every experts module's hidden width over ``mesh["tp"]``;
     EP (``parallelism.ep``) splits every ``titan_core.moe`` experts module over ``ep`` ranks
     (the ep ranks of one tp slice and one pipeline stage); both at once split it over (ep, tp);
  2. activation checkpointing wraps each block's forward;
  3. ``torch.compile`` compiles each block, checkpointing included;
  4. FSDP2 shards (or replicates, or HSDP) every block, then the part as a whole.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..config.parallel_dims import ParallelDims
from ..config.sections import (
    ActivationCheckpointSection,
    CompileSection,
    ParallelismSection,
    TrainingSection,
)
from ..errors import ConfigError, PluginError
from ..plugin.protocols import TensorParallelStyles, TrainSpec
from ..plugin.spec_factories import ParallelizeFn, TensorParallelPlanFn
from .checkpointing import apply_activation_checkpointing
from .compile import apply_compile
from .expert_parallel import apply_expert_parallel, experts_modules
from .expert_tensor_parallel import apply_expert_and_tensor_parallel, apply_expert_tensor_parallel
from .fsdp import apply_fsdp
from .precision import resolve_compute_dtype
from .tensor_parallel import apply_tensor_parallel

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


def model_blocks(model: nn.Module, blocks_attr: str = "layers", *, spec_name: str = "this spec") -> Mapping[str, nn.Module]:
    """The model's blocks by layer id, where the default parallelize_fn applies activation checkpointing, compile
    and FSDP2; a PluginError (the spec's structure, not the core's bug) when ``model.<blocks_attr>`` holds none."""
    blocks = getattr(model, blocks_attr, None)
    if not isinstance(blocks, (nn.ModuleDict, nn.ModuleList)):
        others = [n for n, m in model.named_children() if isinstance(m, (nn.ModuleDict, nn.ModuleList))]
        hint = f" (it has {', '.join(f'model.{n}' for n in others)})" if others else ""
        raise PluginError(
            f"{spec_name}: the default parallelize_fn (a TrainSpec without parallelize_fn gets it) looks for the "
            f"model's blocks in model.{blocks_attr}, an nn.ModuleDict keyed by layer id or an nn.ModuleList; "
            f"{type(model).__name__} has {type(blocks).__name__} there{hint}. Set TrainSpec.parallelize_fn="
            f"default_parallelize_fn(tp_plan_fn, blocks_attr=...) naming the attribute that holds them, or write "
            f"your own parallelize_fn."
        )
    if isinstance(blocks, nn.ModuleList):
        return {str(i): b for i, b in enumerate(blocks)}
    return dict(blocks.items())


def default_parallelize_fn(
    tp_plan_fn: TensorParallelPlanFn | None = None,
    *,
    selective_save_ops: Sequence[str] = (),
    blocks_attr: str = "layers",
    fullgraph: bool = True,
    spec_name: str = "this spec",
) -> ParallelizeFn:
    """Build a ParallelizeFn: TP (from ``tp_plan_fn``) -> AC -> compile -> FSDP2.

    ``selective_save_ops`` is the spec's per-op selective checkpointing list (op
    names such as ``"aten.mm.default"``); the config's
    ``activation_checkpoint.selective_save_ops`` replaces it when set. The blocks
    that AC, compile and FSDP2 treat one by one are ``model.<blocks_attr>``.
    Without a TP plan, ``parallelism.tp > 1`` is a ConfigError.
    """
    save_ops = tuple(selective_save_ops)

    def parallelize(
        model: nn.Module,
        *,
        parallel_dims: ParallelDims,
        mesh: DeviceMesh | None,
        training: TrainingSection,
        parallelism: ParallelismSection,
        compile: CompileSection,
        activation_checkpoint: ActivationCheckpointSection,
        tp_styles: TensorParallelStyles,
    ) -> nn.Module:
        if parallel_dims.tp_enabled:
            if tp_plan_fn is None:
                raise ConfigError(
                    f"{spec_name} has no tensor-parallel plan, but parallelism.tp={parallel_dims.tp}. Set "
                    f"parallelism.tp=1 and use data parallelism (parallelism.dp_shard / dp_replicate)."
                )
            plan = tp_plan_fn(model, styles=tp_styles, loss_parallel=parallelism.loss_parallel)
            assert mesh is not None  # tp > 1: a multi-process run, which has a mesh
            apply_tensor_parallel(model, mesh["tp"], plan, owner=spec_name)
        # After the TP plan, which leaves MoE blocks replicated; a stage may hold dense layers only.
        has_experts = bool(experts_modules(model)) or not parallel_dims.pp_enabled
        if parallelism.etp > 1 and not parallel_dims.ep_enabled and has_experts:
            assert mesh is not None  # etp = tp > 1: a multi-process run, which has a mesh
            apply_expert_tensor_parallel(model, mesh["tp"], what=spec_name)
        expert_mesh = None
        if parallel_dims.ep_enabled:
            assert mesh is not None  # ep > 1: a multi-process run, which has a mesh
            # every part: it creates process groups. With etp too, the experts split over (ep, tp) at once.
            ep_mesh, expert_mesh = parallel_dims.expert_meshes(mesh, with_tp=parallelism.etp > 1)
            if has_experts and parallelism.etp > 1:
                apply_expert_and_tensor_parallel(model, ep_mesh, what=spec_name)
            elif has_experts:
                apply_expert_parallel(model, ep_mesh, what=spec_name)
        blocks = model_blocks(model, blocks_attr, spec_name=spec_name)
        apply_activation_checkpointing(blocks, activation_checkpoint, spec_save_ops=save_ops)
        if compile.enable:
            # Context parallelism's attention exchanges chunks between ranks eagerly: each block's graph breaks there.
            apply_compile(blocks.values(), fullgraph=fullgraph and not parallel_dims.cp_enabled,
                          eager_checkpoints=parallel_dims.cp_enabled)
        apply_fsdp(model, blocks.values(), parallel_dims=parallel_dims, mesh=mesh, parallelism=parallelism,
                   compute_dtype=_compute_dtype(training, mesh), expert_mesh=expert_mesh)
        return model

    return parallelize


def _compute_dtype(training: TrainingSection, mesh: DeviceMesh | None) -> torch.dtype:
    """The run's compute dtype, from the mesh's device (the model is still on meta here)."""

    if mesh is None:  # single process: no FSDP, the value is unused
        return torch.float32
    return resolve_compute_dtype(training.dtype, torch.device(mesh.device_type))


__all__ = ["TensorParallelPlanFn", "default_parallelize_fn", "model_blocks"]


def spec_parallelize_fn(spec: TrainSpec) -> ParallelizeFn:
    """The spec's ``parallelize_fn``, or the default one built from its ``tp_plan_fn`` and
    ``selective_ac_save_ops``. Here rather than on ``TrainSpec``, so the contract module does not
    import an implementation."""
    if spec.parallelize_fn is not None:
        return spec.parallelize_fn
    return default_parallelize_fn(spec.tp_plan_fn, selective_save_ops=spec.selective_ac_save_ops,
                                  spec_name=f"spec {spec.name}")

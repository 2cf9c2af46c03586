"""Tensor parallelism from a plan: ``{module fqn: ParallelStyle}`` applied over ``mesh["tp"]``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from torch import nn

from ..errors import PluginError
from ..models.ties import retie_weights

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh, plan: Mapping[str, Any], *,
                          owner: str = "the tensor-parallel plan") -> None:
    """Shard ``model`` in place following ``plan`` (keys are module names relative to ``model``).

    Every key must name a module of ``model``: a plan that silently matches nothing
    would leave that module replicated and the run would still "work". A column- or row-wise style
    must name a linear or embedding layer (torch's error for another module read as titan-core's own).
    ``owner`` names whose plan it is in the messages (e.g. 'spec "llama3"').
    """
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    modules = dict(model.named_modules())
    missing = sorted(key for key in plan if key not in modules)
    if missing:
        raise PluginError(
            f"{owner}: the tensor-parallel plan names modules this model part does not have: {missing}. "
            f"Plan keys are module names as model.named_modules() prints them; build the plan from the "
            f"part it is given (a pipeline stage lacks the embedding or the head)."
        )
    misfits = [f"{key} ({type(modules[key]).__name__}, {type(style).__name__})" for key, style in plan.items()
               if isinstance(style, (ColwiseParallel, RowwiseParallel))
               and not isinstance(modules[key], (nn.Linear, nn.Embedding))]
    if misfits:
        raise PluginError(
            f"{owner}: the tensor-parallel plan gives a column- or row-wise style to modules that are neither "
            f"linear nor embedding layers: {misfits[:3]}. Those styles split a weight matrix; a norm takes "
            f"SequenceParallel (or stays replicated), and another module is split through the linear layers "
            f"inside it. Where a converter replaced a planned linear layer, the converter must keep it an "
            f"nn.Linear subclass or supply tensor_parallel_styles() for it."
        )
    if plan:
        parallelize_module(model, tp_mesh, dict(plan))
        # Each style gave its module a new DTensor parameter: weights the model declares tied
        # (e.g. an embedding and a head both sharded on the vocabulary) become one tensor again.
        retie_weights(model)

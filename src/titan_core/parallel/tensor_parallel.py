"""Tensor parallelism from a plan: ``{module fqn: ParallelStyle}`` applied over ``mesh["tp"]``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from torch import nn

from ..errors import ConfigError
from ..models.ties import retie_weights

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh, plan: Mapping[str, Any]) -> None:
    """Shard ``model`` in place following ``plan`` (keys are module names relative to ``model``).

    Every key must name a module of ``model``: a plan that silently matches nothing
    would leave that module replicated and the run would still "work".
    """
    from torch.distributed.tensor.parallel import parallelize_module

    names = {name for name, _ in model.named_modules()}
    missing = sorted(key for key in plan if key not in names)
    if missing:
        raise ConfigError(
            f"the tensor-parallel plan names modules this model part does not have: {missing}. "
            f"Plan keys are module names as model.named_modules() prints them; build the plan from the "
            f"part it is given (a pipeline stage lacks the embedding or the head)."
        )
    if plan:
        parallelize_module(model, tp_mesh, dict(plan))
        # Each style gave its module a new DTensor parameter: weights the model declares tied
        # (e.g. an embedding and a head both sharded on the vocabulary) become one tensor again.
        retie_weights(model)

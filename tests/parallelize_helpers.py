"""A spec's ``parallelize_fn`` applied on one process, as the tests of AC, TP plans and specs call it."""

from __future__ import annotations

from typing import Any

from torch import nn

from titan_core import (
    ActivationCheckpointSection,
    CompileSection,
    ParallelDims,
    ParallelismSection,
    TensorParallelStyles,
    TrainingSection,
)


def parallel_kwargs(dims: ParallelDims, *, mesh: Any = None, training: TrainingSection | None = None,
                    parallelism: ParallelismSection | None = None, compile: CompileSection | None = None,
                    **ac: Any) -> dict[str, Any]:
    """The keyword arguments of a ``parallelize_fn`` call: default sections unless given, ``ac`` as the
    activation_checkpoint section's fields, and the default TP styles."""
    return dict(parallel_dims=dims, mesh=mesh, training=training or TrainingSection(),
                parallelism=parallelism or ParallelismSection(), compile=compile or CompileSection(),
                activation_checkpoint=ActivationCheckpointSection(**ac), tp_styles=TensorParallelStyles.default())


def parallelize_alone(fn: Any, model: nn.Module, *, tp: int = 1, training: TrainingSection | None = None,
                      parallelism: ParallelismSection | None = None, **ac: Any) -> nn.Module:
    """``fn(model, ...)`` on one process with ``tp`` ranks of tensor parallelism (1: none) and nothing else."""
    dims = ParallelDims.resolve(dp_replicate=1, dp_shard=1, tp=tp, pp=1, world_size=tp)
    result: nn.Module = fn(model, **parallel_kwargs(dims, training=training, parallelism=parallelism, **ac))
    return result

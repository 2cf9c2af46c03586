"""A spec's ``parallelize_fn`` applied on one process, outside a run: what the tests of activation
checkpointing, TP plans and specs call, and the benchmarks that measure one process's step.

The sections a run would resolve from its config are their defaults unless given; the TP styles are the
default ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from ..config.parallel_dims import ParallelDims
from ..config.sections import ActivationCheckpointSection, CompileSection, ParallelismSection, TrainingSection
from ..plugin.spec_factories import TensorParallelStyles


def parallel_kwargs(dims: ParallelDims, *, mesh: Any = None, training: TrainingSection | None = None,
                    parallelism: ParallelismSection | None = None, compile: CompileSection | None = None,
                    **ac: Any) -> dict[str, Any]:
    """The keyword arguments of a ``parallelize_fn`` call: default sections unless given, ``ac`` as the
    activation_checkpoint section's fields, and the default TP styles."""
    return dict(parallel_dims=dims, mesh=mesh, training=training or TrainingSection(),
                parallelism=parallelism or ParallelismSection(), compile=compile or CompileSection(),
                activation_checkpoint=ActivationCheckpointSection(**ac), tp_styles=TensorParallelStyles.default())


def parallelize_alone(fn: Callable[..., nn.Module], model: nn.Module, *, tp: int = 1, training: TrainingSection | None = None,
                      parallelism: ParallelismSection | None = None, **ac: Any) -> nn.Module:
    """``fn(model, ...)`` on one process with ``tp`` ranks of tensor parallelism (1: none) and nothing else."""
    dims = ParallelDims.resolve(dp_replicate=1, dp_shard=1, tp=tp, pp=1, world_size=tp)
    return fn(model, **parallel_kwargs(dims, training=training, parallelism=parallelism, **ac))

"""The shared pieces of every ``parallelize_fn``: TP from a plan, activation checkpointing,
compile and FSDP2/HSDP, and ``default_parallelize_fn`` that composes them in the fixed order
TP -> AC -> compile -> FSDP2. A model plugin supplies its model and a TP plan function.

Degrees come from the ``ParallelDims`` and mesh the core hands to ``parallelize_fn``;
nothing here re-reads them from the config.
"""

from .checkpointing import apply_activation_checkpointing, checkpoint_module, resolve_ops, selective_context_fn
from .compile import apply_compile
from .default import TensorParallelPlanFn, default_parallelize_fn, spec_parallelize_fn
from .fsdp import apply_fsdp, reshard_policy
from .tensor_parallel import apply_tensor_parallel

__all__ = [
    "TensorParallelPlanFn",
    "apply_activation_checkpointing",
    "apply_compile",
    "apply_fsdp",
    "apply_tensor_parallel",
    "checkpoint_module",
    "default_parallelize_fn",
    "reshard_policy",
    "resolve_ops",
    "selective_context_fn",
    "spec_parallelize_fn",
]

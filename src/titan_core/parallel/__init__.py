"""The shared pieces of every ``parallelize_fn``: TP from a plan, expert parallelism and expert tensor parallelism, activation
checkpointing, compile and FSDP2/HSDP, and ``default_parallelize_fn`` that composes them in the
fixed order TP -> EP -> AC -> compile -> FSDP2. A model plugin supplies its model and a TP plan
function.

Degrees come from the ``ParallelDims`` and mesh the core hands to ``parallelize_fn``;
nothing here re-reads them from the config.

Also the process group and device (``distributed``), compute dtype and autocast (``precision``) and
the printed parameter layout (``parameter_layout``), and a ``parallelize_fn`` applied on one process
with the default sections (``one_process``, for tests and benchmarks). May import ``optim``, ``moe``, ``plugin``,
``models``, ``config``, ``runtime`` and the leaves; independent of the other components.
"""

from .checkpointing import apply_activation_checkpointing, checkpoint_module, resolve_ops, selective_context_fn
from .compile import apply_compile
from .default import TensorParallelPlanFn, default_parallelize_fn, spec_parallelize_fn
from .expert_parallel import apply_expert_parallel, check_expert_parallel, check_experts_split, shard_experts
from .expert_tensor_parallel import apply_expert_tensor_parallel, check_expert_tensor_parallel
from .fsdp import apply_fsdp, reshard_policy
from .one_process import parallel_kwargs, parallelize_alone
from .tensor_parallel import apply_tensor_parallel

__all__ = [
    "TensorParallelPlanFn",
    "apply_activation_checkpointing",
    "apply_compile",
    "apply_expert_parallel",
    "apply_expert_tensor_parallel",
    "apply_fsdp",
    "apply_tensor_parallel",
    "check_expert_parallel",
    "check_expert_tensor_parallel",
    "check_experts_split",
    "checkpoint_module",
    "default_parallelize_fn",
    "parallel_kwargs",
    "parallelize_alone",
    "reshard_policy",
    "resolve_ops",
    "selective_context_fn",
    "shard_experts",
    "spec_parallelize_fn",
]

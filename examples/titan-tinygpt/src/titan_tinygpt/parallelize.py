"""Parallelize a TinyGPT: (no TP) -> activation checkpointing -> compile -> FSDP2.

This runs on the meta device, before ``to_empty`` and weight init, so no tensor
here has data yet. No step renames a parameter: the names stay those of the
plain model, so the per-parameter init seeds and checkpoint keys are the same
for every layout.

The order is the one titan-core documents, and each step assumes the earlier ones:
  1. tensor parallelism would shard the linears first (this example has none, and
     ``validate_tinygpt`` refuses ``parallelism.tp > 1`` before any process starts);
  2. activation checkpointing wraps each block's forward;
  3. ``torch.compile`` compiles each block, checkpointing included;
  4. FSDP2 shards every block, then the root (embeddings, final norm, head).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from titan_core import (
    ActivationCheckpointSection,
    CompileSection,
    ConfigError,
    ParallelDims,
    ParallelismSection,
    TensorParallelStyles,
    TrainingSection,
)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

_NO_TP = (
    "spec tinygpt does not implement tensor parallelism, but parallelism.tp={tp}. Set parallelism.tp=1 "
    "and use data parallelism instead (parallelism.dp_shard / dp_replicate), or use a spec with a TP plan."
)


def parallelize_tinygpt(
    model: nn.Module,
    *,
    parallel_dims: ParallelDims,
    mesh: Any,
    training: TrainingSection,
    parallelism: ParallelismSection,
    compile: CompileSection,
    activation_checkpoint: ActivationCheckpointSection,
    tp_styles: TensorParallelStyles,
) -> nn.Module:
    """The spec's ParallelizeFn: apply the enabled features to ``model`` in place and return it."""
    del training, tp_styles  # part of the protocol; used by models that implement TP
    if parallel_dims.tp_enabled:
        # validate_tinygpt already refused this; kept for library users who skip validation.
        raise ConfigError(_NO_TP.format(tp=parallel_dims.tp))
    apply_activation_checkpointing(model.layers, activation_checkpoint)
    if compile.enable:
        for block in model.layers.values():
            # nn.Module.compile keeps the module in place (no _orig_mod wrapper, names unchanged).
            block.compile()
    if parallel_dims.dp > 1:
        apply_fsdp(model, parallel_dims.dp_mesh(mesh), parallelism)
    return model


def apply_activation_checkpointing(layers: nn.ModuleDict, ac: ActivationCheckpointSection) -> list[str]:
    """Recompute the chosen blocks' activations in backward; returns the names of those blocks.

    ``full`` checkpoints every block; ``selective`` with ``selective_every = N``
    every Nth. Per-op selective checkpointing (``selective_every = 0``) is a
    ConfigError: this example does not implement it.
    """
    if ac.mode == "none":
        return []
    every = 1
    if ac.mode == "selective":
        if ac.selective_every == 0:
            raise ConfigError(
                "spec tinygpt supports activation_checkpoint.mode=full, or mode=selective with "
                "activation_checkpoint.selective_every=N (every Nth block); per-op selective checkpointing "
                "(selective_every=0) is not implemented. Set selective_every or use mode=full."
            )
        every = ac.selective_every
    chosen = [name for name in layers if (int(name) + 1) % every == 0]
    for name in chosen:
        _checkpoint_forward(layers[name])
    return chosen


def _checkpoint_forward(block: nn.Module) -> None:
    # torch's checkpoint_wrapper would nest the block under "_checkpoint_wrapped_module",
    # renaming its parameters. Shadowing forward on the instance keeps the module tree,
    # and nn.Module.__call__ (with the hooks FSDP2 adds later) still runs around it.
    inner = block.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(inner, *args, use_reentrant=False, **kwargs)

    block.forward = forward  # type: ignore[method-assign]


def apply_fsdp(model: nn.Module, dp_mesh: Any, parallelism: ParallelismSection) -> None:
    """FSDP2 on each block, then on the root; a 2-D mesh (dp_replicate x dp_shard) gives HSDP.

    With ``dp_shard = 1`` and ``dp_replicate > 1`` the mesh is the replicate
    dimension, so the parameters are sharded over it: numerically the same as
    replication, with less memory and more communication.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=_DTYPES[parallelism.param_dtype], reduce_dtype=_DTYPES[parallelism.reduce_dtype])
    policy = parallelism.fsdp_reshard_after_forward
    blocks = list(model.layers.values())
    for i, block in enumerate(blocks):
        # "default": free each block's gathered weights after its forward, except the
        # last block's, which backward needs first and would gather straight back.
        reshard = policy == "always" or (policy == "default" and i < len(blocks) - 1)
        fully_shard(block, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=policy == "always")


def validate_tinygpt(args: Any, *, parallelism: ParallelismSection, training: TrainingSection, world_size: int) -> None:
    """The spec's validate_fn: refuse what TinyGPT cannot do, before any process group exists."""
    del world_size  # the core already checked that the degrees multiply to it
    if parallelism.tp > 1:
        raise ConfigError(_NO_TP.format(tp=parallelism.tp))
    if parallelism.pp > 1:
        raise ConfigError(
            f"spec tinygpt has no pipelining_fn, but parallelism.pp={parallelism.pp}. Set parallelism.pp=1 "
            f"and use data parallelism instead."
        )
    if args.dim % args.n_heads:
        raise ConfigError(
            f"tinygpt: dim={args.dim} is not divisible by n_heads={args.n_heads}; every head gets dim/n_heads "
            f"channels. Choose a flavor or n_heads that divides dim."
        )
    if training.seq_len > args.max_seq_len:
        raise ConfigError(
            f"training.seq_len={training.seq_len} is longer than tinygpt's position embedding "
            f"(max_seq_len={args.max_seq_len}). Lower training.seq_len, or raise it with "
            f"--tinygpt.max_seq_len={training.seq_len}."
        )

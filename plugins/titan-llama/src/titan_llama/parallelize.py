"""Parallelize one Llama model part: TP -> activation checkpointing -> compile -> FSDP2.

Everything here runs on the meta device, before ``to_empty`` and weight init, on
either the whole ``Transformer`` or one pipeline stage of it (a Transformer whose
missing pieces are ``None`` and whose ``layers`` hold only its own blocks). No
step renames a parameter: fully qualified names stay those of the plain model,
so checkpoints and the per-parameter init seeds do not depend on the layout.

The order is fixed, and each step assumes the previous ones:
  1. TP shards the linears (parameters become DTensors on the ``tp`` mesh);
  2. activation checkpointing wraps each block's forward;
  3. ``torch.compile`` compiles each block (including its checkpointing);
  4. FSDP2 shards (or replicates) every block, then the part as a whole.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from titan_core import (
    ActivationCheckpointSection,
    CompileSection,
    ConfigError,
    ParallelDims,
    ParallelismSection,
    TensorParallelStyles,
    TrainingSection,
)

from .activation_checkpoint import apply_activation_checkpointing
from .tp_plan import apply_tensor_parallel

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def parallelize_llama(
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
    """Apply the enabled parallelisms to ``model`` in place and return it (the ParallelizeFn)."""
    del training  # part of the protocol; nothing here depends on it yet
    if parallel_dims.tp_enabled:
        apply_tensor_parallel(model, mesh["tp"], tp_styles, loss_parallel=parallelism.loss_parallel)
    apply_activation_checkpointing(model.layers, activation_checkpoint)
    if compile.enable:
        apply_compile(model.layers)
    if parallel_dims.dp > 1:
        apply_data_parallel(model, parallel_dims.dp_mesh(mesh), parallel_dims=parallel_dims, parallelism=parallelism)
    return model


def apply_compile(layers: nn.ModuleDict) -> None:
    """Compile each block in place.

    ``nn.Module.compile`` keeps the module (no ``_orig_mod`` wrapper, so names are
    unchanged). Compiling blocks rather than the whole model keeps graphs small
    and lets the identical blocks reuse one compilation.
    """
    for block in layers.values():
        block.compile(fullgraph=True)


def reshard_policy(policy: str, *, is_last_block: bool, pp_enabled: bool) -> bool:
    """FSDP2 ``reshard_after_forward`` for a block under ``parallelism.fsdp_reshard_after_forward``.

    ``default`` frees each block's gathered weights after its forward, except the
    last block's (backward starts there and would gather them straight back), and
    keeps them with pipelining, whose microbatches rerun every forward.
    """
    if policy == "always":
        return True
    if policy == "never":
        return False
    return not pp_enabled and not is_last_block


def apply_data_parallel(
    model: nn.Module, dp_mesh: Any, *, parallel_dims: ParallelDims, parallelism: ParallelismSection
) -> None:
    """FSDP2 per block then on the root: HSDP on a 2-D mesh, DDP-style replication without dp_shard."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=_DTYPES[parallelism.param_dtype], reduce_dtype=_DTYPES[parallelism.reduce_dtype])
    blocks = list(model.layers.values())
    if not parallel_dims.fsdp_enabled:
        # Pure replication: FSDP2's replicate keeps whole parameters on every rank
        # and all-reduces gradients; it shares FSDP2's machinery, so it composes
        # with TP DTensors and pipeline schedules the same way fully_shard does.
        from torch.distributed._composable.replicate_with_fsdp import replicate

        for block in blocks:
            replicate(block, mesh=dp_mesh, mp_policy=mp)
        replicate(model, mesh=dp_mesh, mp_policy=mp)
        return
    for i, block in enumerate(blocks):
        reshard = reshard_policy(
            parallelism.fsdp_reshard_after_forward, is_last_block=i == len(blocks) - 1, pp_enabled=parallel_dims.pp_enabled
        )
        fully_shard(block, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard)
    root_reshard = parallelism.fsdp_reshard_after_forward == "always"
    fully_shard(model, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=root_reshard)


def validate_llama_layout(
    args: Any, *, parallelism: ParallelismSection, training: TrainingSection, world_size: int
) -> None:
    """Fail fast (ConfigError) on a layout the model cannot be split into (the spec's validate_fn).

    Runs before any process group exists. Checks that TP divides every sharded
    dimension (heads, kv heads, MLP width, vocabulary, and the sequence for
    sequence parallelism), and that the pipeline settings fit the layers and batch.
    """
    from .pipeline import validate_pipeline

    ParallelDims.resolve(
        dp_replicate=parallelism.dp_replicate, dp_shard=parallelism.dp_shard,
        tp=parallelism.tp, pp=parallelism.pp, world_size=world_size,
    )
    tp = parallelism.tp
    if tp > 1:
        n_kv_heads = args.n_kv_heads if args.n_kv_heads is not None else args.n_heads
        checks = [
            ("model n_heads", args.n_heads),
            ("model n_kv_heads", n_kv_heads),
            ("model dim", args.dim),
            ("model vocab_size", args.vocab_size),
            ("training.seq_len (sequence parallelism shards the sequence)", training.seq_len),
            ("the MLP hidden size (LlamaArgs.ffn_hidden_dim)", args.ffn_hidden_dim),
        ]
        for what, value in checks:
            if value is not None and value % tp:
                raise ConfigError(
                    f"parallelism.tp={tp} does not divide {what}={value}: tensor parallelism splits it evenly "
                    f"over the tp ranks. Choose a tp degree that divides it (or change the model)."
                )
    if parallelism.pp > 1 and getattr(args, "tie_embeddings", False):
        raise ConfigError(
            f"parallelism.pp={parallelism.pp}: this model ties its output head to its embedding "
            f"(tie_embeddings), and pipeline stages cannot share one tensor (the embedding is in the first "
            f"stage, the head in the last). Use FSDP2/TP for this model, or an untied flavor."
        )
    if parallelism.pp > 1:
        validate_pipeline(parallelism, training, n_layers=args.n_layers)

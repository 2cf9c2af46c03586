"""Parallelize one Llama model part: titan-core's default TP -> AC -> compile -> FSDP2 with Llama's TP plan.

Everything here runs on the meta device, on either the whole ``Transformer`` or
one pipeline stage of it (a Transformer whose missing pieces are ``None`` and
whose ``layers`` hold only its own blocks). The shared steps live in
``titan_core.parallel``; this module supplies what is Llama's own: the TP plan
(``tp_plan.llama_tp_plan``), the per-op selective checkpointing list, and the
layout validation.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from titan_core import ActivationCheckpointSection, ConfigError, ParallelismSection, TrainingSection
from titan_core.parallel import default_parallelize_fn

from . import cpu_attention  # noqa: F401  (registers torch.ops.titan_llama.causal_attention)
from .ac_ops import FUSED_ATTENTION, LLAMA_SELECTIVE_SAVE_OPS, SDPA_OPS
from .tp_plan import llama_tp_plan

_default = default_parallelize_fn(llama_tp_plan, selective_save_ops=LLAMA_SELECTIVE_SAVE_OPS, spec_name="spec llama3")


def _with_fused_attention(ac: ActivationCheckpointSection) -> ActivationCheckpointSection:
    """A user's op list that saves an SDPA kernel also saves the fused kernel that replaces it on CPU."""
    ops = ac.selective_save_ops
    if ops is None or FUSED_ATTENTION in ops or not set(SDPA_OPS) & set(ops):
        return ac
    return ac.model_copy(update={"selective_save_ops": [*ops, FUSED_ATTENTION]})


def parallelize_llama(model: nn.Module, *, activation_checkpoint: ActivationCheckpointSection, **kwargs: Any) -> nn.Module:
    """Apply the enabled parallelisms to ``model`` in place and return it (the spec's ParallelizeFn)."""
    return _default(model, activation_checkpoint=_with_fused_attention(activation_checkpoint), **kwargs)


def validate_llama_layout(
    args: Any, *, parallelism: ParallelismSection, training: TrainingSection, world_size: int
) -> None:
    """Fail fast (ConfigError) on a layout the model cannot be split into (the spec's validate_fn).

    Runs before any process group exists, after the core has checked the degrees
    against the world size. Checks that TP divides every sharded dimension (heads,
    kv heads, MLP width, vocabulary, and the sequence for sequence parallelism), and
    that the pipeline settings fit the layers.
    """
    from .pipeline import validate_pipeline

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

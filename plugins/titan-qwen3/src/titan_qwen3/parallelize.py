"""Layout checks for qwen3 (the spec's validate_fn): what TP and PP need of the model's shape.

Runs before any process group exists, after the core has checked the degrees against the
world size.
"""

from __future__ import annotations

from typing import Any

from titan_core import ConfigError, ParallelismSection, TrainingSection


def validate_qwen3_layout(
    args: Any, *, parallelism: ParallelismSection, training: TrainingSection, world_size: int
) -> None:
    """ConfigError for a layout the model cannot be split into."""
    from titan_core.parallel.pipeline import validate_pipeline
    from titan_core.parallel.tp_plans import check_decoder_tp

    tp, pp = parallelism.tp, parallelism.pp
    if tp > 1:
        dense = any(not args.is_sparse(i) for i in range(args.n_layers))
        check_decoder_tp(tp, heads=[("model n_heads", args.n_heads), ("model n_kv_heads", args.n_kv_heads)], vocab_size=args.vocab_size,
                         seq_len=training.seq_len, dense_intermediate_size=args.intermediate_size if dense else None)
    if pp > 1:
        if args.tie_embeddings:
            raise ConfigError(
                f"parallelism.pp={pp}: this flavor ties its output head to its embedding (tie_embeddings), and "
                f"pipeline stages cannot share one tensor (the embedding is in the first stage, the head in the "
                f"last). Use FSDP2/TP for this flavor, or an untied one."
            )
        validate_pipeline(parallelism, training, n_layers=args.n_layers)

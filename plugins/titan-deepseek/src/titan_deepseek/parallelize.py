"""Layout checks for deepseek_v3 (the spec's validate_fn): what PP needs of the model's shape, and the
layouts multi-token prediction does not support yet (and its loss weight given without the block).

Runs before any process group exists, after the core has checked the degrees against the
world size. Tensor parallelism splits the attention heads, the dense MLPs, the vocabulary and
the sequence (tp_plan.py); experts split over ranks with ``parallelism.ep``.
"""

from __future__ import annotations

from typing import Any

from titan_core import ConfigError, ParallelismSection, TrainingSection


def validate_deepseek_v3_layout(
    args: Any, *, parallelism: ParallelismSection, training: TrainingSection, world_size: int
) -> None:
    """ConfigError for a layout the model cannot be split into."""
    from titan_core.parallel.pipeline import validate_pipeline
    from titan_core.parallel.tp_plans import check_decoder_tp

    from .model import DeepSeekV3Args

    tp, pp = parallelism.tp, parallelism.pp
    # Here rather than in DeepSeekV3Args: the weight only matters to training, and a model built without the
    # block from args that carry one (dataclasses.replace(args, mtp_layers=0)) is legitimate.
    if not args.mtp_layers and args.mtp_loss_weight != DeepSeekV3Args.mtp_loss_weight:
        raise ConfigError(
            f"deepseek_v3.mtp_loss_weight={args.mtp_loss_weight} weighs the multi-token-prediction loss, but "
            f"mtp_layers=0 builds no prediction block, so the setting would do nothing. Set "
            f"--deepseek_v3.mtp_layers=1 to train the block, or leave mtp_loss_weight out."
        )
    if args.mtp_layers:
        split = [f"{name}={degree}" for name, degree in (("tp", tp), ("pp", pp), ("cp", parallelism.cp)) if degree > 1]
        if split:
            raise ConfigError(
                f"deepseek_v3.mtp_layers={args.mtp_layers} with parallelism.{', parallelism.'.join(split)}: the "
                f"multi-token-prediction block reads the whole sequence's last hidden states, the embedding and the "
                f"output head in one forward, and is not split over tensor, pipeline or context-parallel ranks yet. "
                f"Train it with FSDP2 / HSDP and expert parallelism, or set --deepseek_v3.mtp_layers=0."
            )
    if tp > 1:
        dense = any(not args.is_sparse(i) for i in range(args.n_layers))
        check_decoder_tp(tp, heads=[("model n_heads", args.n_heads)], vocab_size=args.vocab_size,
                         seq_len=training.seq_len, dense_intermediate_size=args.intermediate_size if dense else None)
    if pp > 1:
        if args.tie_embeddings:
            raise ConfigError(
                f"parallelism.pp={pp}: this model ties its output head to its embedding (tie_embeddings), and "
                f"pipeline stages cannot share one tensor. Use FSDP2 for it, or an untied flavor."
            )
        validate_pipeline(parallelism, training, n_layers=args.n_layers)

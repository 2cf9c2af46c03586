"""``validate_tinygpt``: refuse what TinyGPT cannot do, before any process group exists."""

from __future__ import annotations

from typing import Any

from titan_core import ConfigError, ParallelismSection, TrainingSection


def validate_tinygpt(args: Any, *, parallelism: ParallelismSection, training: TrainingSection, world_size: int) -> None:
    """The spec's validate_fn (the core already checked that the degrees multiply to ``world_size``)."""
    del world_size
    tp = parallelism.tp
    if tp > 1:
        for what, value in (("n_heads", args.n_heads), ("dim", args.dim), ("the MLP width (mlp_ratio x dim)",
                            args.mlp_ratio * args.dim), ("vocab_size", args.vocab_size)):
            if value is not None and value % tp:
                raise ConfigError(
                    f"parallelism.tp={tp} does not divide tinygpt {what}={value}: tensor parallelism splits it "
                    f"evenly over the tp ranks. Choose a tp degree that divides it (or another flavor)."
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

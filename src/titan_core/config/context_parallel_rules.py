"""What ``parallelism.cp`` > 1 combines with, checked when the config is validated (before any process starts)."""

from __future__ import annotations

from collections.abc import Mapping

from .sections import ParallelismSection


def check_context_parallel(p: ParallelismSection, *, seq_len: int, features_on: Mapping[str, bool]) -> None:
    """ValueError (one message, naming the keys) when the config asks for context parallelism with sequences it
    cannot split evenly, or with one of ``features_on`` (config key -> whether it is on) that it cannot serve yet."""
    if p.cp == 1:
        return
    chunks = 2 * p.cp if p.cp_load_balance else p.cp
    if seq_len % chunks:
        raise ValueError(
            f"parallelism.cp={p.cp}: training.seq_len={seq_len} must split into {chunks} equal chunks "
            f"({'2 x cp, an early and a late chunk per rank' if p.cp_load_balance else 'one per rank'}). Choose a "
            f"seq_len that is a multiple of {chunks}"
        )
    refused = [key for key, on in features_on.items() if on]
    if refused:
        raise ValueError(
            f"parallelism.cp={p.cp} with {', '.join(refused)}: not supported yet (docs/distributed.md, \"Context "
            f"parallelism\"). Turn {'it' if len(refused) == 1 else 'them'} off, or set parallelism.cp=1"
        )

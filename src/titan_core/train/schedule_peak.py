"""The activations a pipeline rank holds at its peak, read from the schedule's own program.

torch's multi-stage schedules (Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble,
DualPipeV) each compute, per rank, the order of its forwards and backwards. Replaying that order,
adding a stage's activations at its forward and dropping them at the backward that frees them, gives
the rank's peak without a closed formula per schedule (they differ: LoopedBFS runs every forward
before any backward, the V schedules run more of their first stage's). A schedule whose program
cannot be read this way (a torch that computes it differently) gives None, and the caller falls
back to its formula.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

# Where a stage-micro-batch's saved activations are freed: at its full backward, or, when the backward is
# split, at the weight half (the input half keeps what the weight gradients need).
_FREES = ("FULL_BACKWARD", "BACKWARD_WEIGHT")


def schedule_program(schedule: str, *, pp: int, local_stages: int, microbatches: int,
                     rank: int) -> list[Any] | None:
    """The ordered actions of ``rank`` in torch's ``schedule``, or None where it cannot be read."""
    try:
        from torch.distributed.pipelining.schedules import get_schedule_class

        cls = get_schedule_class(schedule)
        calculate = getattr(cls, "_calculate_single_rank_operations", None)
        if calculate is None:
            return None
        rounds = max(1, microbatches // pp)
        # The attributes the schedules' constructors set before they compute their programs.
        state = SimpleNamespace(pp_group_size=pp, _n_microbatches=microbatches, n_local_stages=local_stages,
                                number_of_rounds=rounds, microbatches_per_round=microbatches // rounds, rank=rank,
                                num_stages=pp * local_stages, _num_stages=pp * local_stages,
                                _stages=[None] * local_stages, pipeline_order={})
        return [a for a in calculate(state, rank) if a is not None]
    except Exception:  # noqa: BLE001 - any torch whose schedules are built otherwise: the formula serves
        return None


def peak_in_flight_bytes(program: Sequence[Any], stage_bytes: dict[int, int]) -> int:
    """The most bytes of saved activations alive at once when ``program`` runs, ``stage_bytes`` giving what
    one micro-batch of each (global) stage id keeps until the backward that frees it."""
    alive: dict[tuple[int, int | None], int] = {}
    peak = 0
    for action in _flattened(program):
        kind = action.computation_type.name
        key = (action.stage_index, action.microbatch_index)
        if kind == "FORWARD":
            alive[key] = stage_bytes.get(action.stage_index, 0)
            peak = max(peak, sum(alive.values()))
        elif kind in _FREES:
            alive.pop(key, None)
    return peak


def _flattened(program: Sequence[Any]) -> list[Any]:
    actions: list[Any] = []
    for action in program:
        subs = getattr(action, "sub_actions", None)
        actions.extend(subs if subs else [action])
    return actions


__all__ = ["peak_in_flight_bytes", "schedule_program"]

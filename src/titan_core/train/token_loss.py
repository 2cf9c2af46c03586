"""The loss as a mean per valid token of the whole step, on any layout.

A micro-batch's loss function returns the mean over its own valid labels (those not
``IGNORE_INDEX``). Averaging those means (per micro-batch, then over data-parallel
ranks) weights a token by how many others share its micro-batch: with uneven shares of
ignored labels, the same data on another layout would train differently. Instead each
micro-batch's mean is weighted by its share of the step's valid tokens:

    loss_i = mean_i * n_i * dp / N            (N: valid labels of the whole step, all ranks)

The factor dp undoes the gradient averaging of FSDP2 / DDP over the data-parallel ranks,
so the gradients are those of ``sum of every valid token's loss / N``, whatever the
number of ranks or accumulation micro-batches. Each rank counts its labels before the
forward (the loader's CPU tensors: no accelerator sync), and one all-reduce over the
data-parallel group gives N.

When every label is valid and micro-batches are equal, ``N / (n_i * dp)`` is exactly
the number of accumulation steps, and ``mean_i / that`` is bit for bit today's
``mean_i / accum``: loss curves of runs without ignored labels do not move.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from ..models.loss import IGNORE_INDEX

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup


def count_valid(labels: torch.Tensor) -> int:
    """Labels that count in the loss (not ``IGNORE_INDEX``)."""
    return int(labels.ne(IGNORE_INDEX).sum())


def global_valid_tokens(local: int, *, group: ProcessGroup | None, device: torch.device) -> int | torch.Tensor:
    """``local`` summed over the data-parallel ``group`` (None: this process alone, an int).

    Over a group the sum stays on the device (a 0-d int64 tensor): reading it on the host
    would wait for the accelerator every step."""
    if group is None:
        return local
    total = torch.tensor([local], dtype=torch.int64, device=device)
    dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
    return total.reshape(())


def token_weighted(mean: torch.Tensor, *, valid: int, global_valid: int | torch.Tensor, dp: int,
                   splits: int = 1) -> torch.Tensor:
    """``mean`` (over ``valid`` labels) as its share of the step's per-valid-token loss.

    ``splits``: how many equal parts the caller's gradients are later divided into (a
    pipeline schedule divides by its number of microbatches). A micro-batch without a
    valid label contributes exactly zero (its mean is 0/0) but still runs its backward,
    so every rank runs the same collectives.
    """
    if valid == 0:
        return torch.nan_to_num(mean, nan=0.0) * 0.0
    # Integers, then one division: with every label valid this is exactly the accumulation count.
    if isinstance(global_valid, torch.Tensor):  # on the device: the same float64 division, then mean's dtype
        return mean / (global_valid.double() / (valid * dp * splits)).to(mean.dtype)
    return mean / (global_valid / (valid * dp * splits))


def token_loss_sum(mean: torch.Tensor, *, valid: int) -> torch.Tensor:
    """``mean`` (over ``valid`` labels) back as the sum of those labels' losses; exactly 0 with none (0/0)."""
    return torch.zeros_like(mean) if valid == 0 else mean * valid


def global_token_mean(local_sum: torch.Tensor, *, valid: int, tp: int, pp: int, device: torch.device) -> float:
    """Summed token losses over every data-parallel rank / their valid labels, in one all-reduce over all ranks.

    ``local_sum`` is this rank's (zero on pipeline ranks without the last stage; the same on
    the ``tp`` ranks of a group); ``valid`` is counted on every rank, so ``tp x pp`` times.
    NaN when no label of any rank is valid.
    """
    both = torch.stack([local_sum.detach().double().reshape(()),
                        torch.tensor(float(valid), dtype=torch.float64, device=device)])
    if dist.is_initialized():
        dist.all_reduce(both, op=dist.ReduceOp.SUM)
    total, count = float(both[0]) / tp, float(both[1]) / (tp * pp)
    return total / count if count else float("nan")

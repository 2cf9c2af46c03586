"""The default loss: token-level cross-entropy over the vocabulary."""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: labels equal to this take no part in the loss (torch's cross_entropy default)
IGNORE_INDEX = -100


def cross_entropy_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the valid tokens (labels not ``IGNORE_INDEX``); logits [b, s, vocab], labels [b, s].

    The trainer weights this mean by the micro-batch's share of the step's valid tokens
    (token_loss.py), so a loss function must return exactly this mean.

    Computed in float32 whatever the logits' dtype, because a bf16 log-softmax over
    a large vocabulary loses the small probabilities that make up the loss.
    """
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1), ignore_index=IGNORE_INDEX)


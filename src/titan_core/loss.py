"""The default loss: token-level cross-entropy over the vocabulary."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def cross_entropy_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every token; logits [b, s, vocab], labels [b, s].

    Computed in float32 whatever the logits' dtype, because a bf16 log-softmax over
    a large vocabulary loses the small probabilities that make up the loss.
    """
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))


"""Terms a model adds to its own training loss (plugin API 1.2), and the labels it may ask for.

Some objectives live inside the model: DeepSeek-V3's multi-token prediction scores a second
head on the token after next, a term the trainer's cross-entropy over the logits cannot see. A
model offers such a term through a :class:`LossTerm` submodule: its forward computes the
term (already multiplied by its weight) and hands it over with :meth:`LossTerm.add_to_loss`,
with the figure to report beside the loss. The trainer takes every pending term after each
micro-batch's forward and differentiates ``loss + term / gradient_accumulation_steps``, as it
does with the MoE load-balancing loss: the term is each micro-batch's own mean, and the
reported ``loss`` stays the cross-entropy. The reported figure is logged as ``metric``, averaged
over the step's micro-batches and the data-parallel ranks.

A model whose ``forward`` declares a ``labels`` keyword receives the micro-batch's labels
(``[B, S]``, ``IGNORE_INDEX`` where a token takes no part) in training forwards that hold whole
sequences in one call: no pipeline stages and no context parallelism, where labels are absent
(None). Validation, evaluation and sampling forwards get no labels: a model computes no term then.
"""

from __future__ import annotations

import inspect
from typing import ClassVar

import torch
from torch import nn

__all__ = ["LABELS_KWARG", "LossTerm", "forward_declares"]

#: the keyword a model's forward declares to receive the micro-batch's labels
LABELS_KWARG = "labels"


class LossTerm(nn.Module):
    """A part of a model that adds a term to the training loss; ``metric`` names its figure in the metrics."""

    metric: ClassVar[str] = "aux_loss"

    def __init__(self) -> None:
        super().__init__()
        self._pending: tuple[torch.Tensor, torch.Tensor] | None = None

    def add_to_loss(self, term: torch.Tensor, *, reported: torch.Tensor) -> None:
        """From the forward: ``term`` (a scalar with its graph, weight applied) joins this micro-batch's loss;
        ``reported`` (a scalar, e.g. the unweighted loss) is the figure logged as ``metric``."""
        self._pending = (term, reported.detach())

    def take(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(term, reported) of the last forward, or None; cleared, so a forward without a term adds nothing."""
        pending, self._pending = self._pending, None
        return pending


def forward_declares(model_cls: type, keyword: str) -> bool:
    """Whether ``model_cls.forward`` declares ``keyword`` by name (``**kwargs`` is not a declaration)."""
    forward = getattr(model_cls, "forward", None)
    if forward is None:
        return False
    try:
        param = inspect.signature(forward).parameters.get(keyword)
    except (TypeError, ValueError):  # a builtin or C forward without a signature
        return False
    return param is not None and param.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)

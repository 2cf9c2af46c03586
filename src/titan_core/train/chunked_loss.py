"""Cross-entropy through the output head, one chunk of tokens at a time.

The full-logits loss holds the float32 logits [tokens, vocab], their log-softmax and their
gradient at once: at 4 x 2048 tokens and a 128,256 vocabulary, 4 GiB each. Here the head
and the loss run per chunk of tokens inside one autograd function whose forward also takes
each chunk's gradients (with respect to the hidden states and the head's weight) and drops
the chunk's logits; its backward only scales those gradients by the incoming one. Nothing
is recomputed: per chunk, the three matmuls of the full-logits path.

The head is called as the module it is, so tensor parallelism's hooks (a vocabulary-sharded
head, loss parallel) act on every chunk as on the full logits, and FSDP2's gathered weight
(the root's, kept gathered between forward and backward) is the one that gets the gradient.
The value is the mean over the valid labels, as :func:`titan_core.loss.cross_entropy_loss`;
losses and gradients agree with it to float32 rounding (the sums run per chunk).

With a z-loss coefficient (``[stability] z_loss``, z_loss.py) each chunk's gradients are those of
its cross-entropy plus the coefficient times its valid tokens' ``logsumexp(logits)**2``, taken from
the same chunk logits; the value stays the cross-entropy alone, and the z-loss sum comes back
beside it, detached, to be logged.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..models.loss import IGNORE_INDEX
from .z_loss import laid_out_like, logsumexp_squared_sum

#: logits per chunk when the caller names no chunk size: 64 MiB in float32
CHUNK_ELEMENTS = 1 << 24


def rows_per_chunk(vocab_local: int, chunk_tokens: int = 0) -> int:
    """Tokens per chunk: ``chunk_tokens`` when positive, else as many as fit ``CHUNK_ELEMENTS`` logits."""
    return chunk_tokens if chunk_tokens > 0 else max(1, CHUNK_ELEMENTS // max(1, vocab_local))


def chunkable_head(head: nn.Module) -> bool:
    """Whether ``head`` can be applied per chunk here: a plain ``nn.Linear`` that is not its own FSDP2
    unit (such a head regathers and reduces per call; it keeps the full-logits path).

    Only the plain class: a converter's head (float8, MX) scales its input per call, so per chunk it
    would quantize with other scales than over the whole batch and train other numbers."""
    from torch.distributed.fsdp import FSDPModule

    weight = getattr(head, "weight", None)
    return (type(head) is nn.Linear and isinstance(weight, torch.Tensor) and weight.dim() == 2
            and not isinstance(head, FSDPModule))


def chunked_cross_entropy(hidden: torch.Tensor, head: nn.Module, labels: torch.Tensor, *, valid: int,
                          chunk_tokens: int = 0) -> torch.Tensor:
    """Mean cross-entropy of ``head(hidden)`` against ``labels`` over the ``valid`` labels (those not
    ``IGNORE_INDEX``; counted by the caller, on the host); hidden [b, s, dim], labels [b, s].

    ``hidden`` may be a sequence-sharded DTensor (tensor parallelism): it is gathered once (the
    head would gather it anyway), differentiably. NaN with no valid label, as the plain mean.
    """
    return chunked_cross_entropy_and_z(hidden, head, labels, valid=valid, chunk_tokens=chunk_tokens)[0]


def chunked_cross_entropy_and_z(hidden: torch.Tensor, head: nn.Module, labels: torch.Tensor, *, valid: int,
                                chunk_tokens: int = 0, z_coeff: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """As :func:`chunked_cross_entropy`, whose gradient also holds ``z_coeff`` times the mean over the valid
    labels of ``logsumexp(logits)**2``; and, detached, ``z_coeff`` times that sum (zero when ``z_coeff`` is 0
    or without gradients: the z-loss is a training term only)."""
    weight = head.weight
    assert isinstance(weight, torch.Tensor)
    rows = rows_per_chunk(_local(weight).shape[0], chunk_tokens)
    hidden = _replicated(hidden)
    flat_labels = labels.reshape(-1)
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        total, z_sum = _ChunkedHeadLoss.apply(hidden, weight, head, flat_labels, rows, z_coeff)  # type: ignore[no-untyped-call]  # torch leaves apply untyped
    else:
        total, z_sum = _loss_sum(hidden, head, flat_labels, rows), torch.zeros((), device=_local(hidden).device)
    return (total / valid if valid else total * float("nan")), z_sum


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _replicated(hidden: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor, Replicate

    if isinstance(hidden, DTensor) and not all(p.is_replicate() for p in hidden.placements):
        return hidden.redistribute(placements=[Replicate()] * hidden.device_mesh.ndim)
    return hidden


def _pieces(hidden: torch.Tensor, rows: int, *, leaves: bool) -> Iterator[tuple[slice, torch.Tensor, torch.Tensor]]:
    """(token rows, plain piece, what the head takes) per chunk of ``hidden`` flattened to [tokens, dim].
    ``leaves``: each plain piece is a fresh leaf that requires grad (its gradient is the chunk's)."""
    from torch.distributed.tensor import DTensor

    local = _local(hidden)
    flat = local.reshape(-1, local.shape[-1])
    for start in range(0, flat.shape[0], rows):
        span = slice(start, min(start + rows, flat.shape[0]))
        piece = flat[span].detach().requires_grad_() if leaves else flat[span]
        if isinstance(hidden, DTensor):  # replicated: every rank holds the whole chunk
            yield span, piece, DTensor.from_local(piece, hidden.device_mesh, hidden.placements, run_check=False)
        else:
            yield span, piece, piece


def _chunk_loss_sum(head: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return _chunk_terms(head, x, labels, z_coeff=0.0)[0]


def _chunk_terms(head: nn.Module, x: torch.Tensor, labels: torch.Tensor, *, z_coeff: float
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The chunk's summed cross-entropy and, with ``z_coeff``, its valid tokens' summed ``logsumexp**2``
    times ``z_coeff`` (None without): both from the one float32 copy of the chunk's logits."""
    logits = head(x).float()
    ce = F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="sum")
    if not z_coeff:
        return ce, None
    return ce, laid_out_like(ce, z_coeff * logsumexp_squared_sum(logits, labels))


def _loss_sum(hidden: torch.Tensor, head: nn.Module, labels: torch.Tensor, rows: int) -> torch.Tensor:
    """The summed token losses without gradients (validation, no_grad)."""
    total: torch.Tensor | None = None
    for span, _, x in _pieces(hidden, rows, leaves=False):
        part = _chunk_loss_sum(head, x, labels[span])
        total = part if total is None else total + part
    assert total is not None, "no tokens"
    return total


class _ChunkedHeadLoss(torch.autograd.Function):
    """Sum of the token losses of ``head(hidden)``; the forward takes the gradients chunk by chunk."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, head: nn.Module, labels: torch.Tensor,
                rows: int, z_coeff: float) -> tuple[torch.Tensor, torch.Tensor]:
        from torch.distributed.tensor import DTensor

        local = _local(hidden)
        grad_hidden = torch.empty_like(local).reshape(-1, local.shape[-1]) if hidden.requires_grad else None
        grad_weight: torch.Tensor | None = None
        total: torch.Tensor | None = None
        z_total = torch.zeros((), device=local.device)
        with torch.enable_grad():
            for span, piece, x in _pieces(hidden, rows, leaves=True):
                part, z_part = _chunk_terms(head, x, labels[span], z_coeff=z_coeff)
                wanted = [piece] + ([weight] if weight.requires_grad else [])
                # The gradient of the objective (cross-entropy + z-loss); the value kept is the cross-entropy.
                grads = torch.autograd.grad(part if z_part is None else part + z_part, wanted)
                if z_part is not None:
                    z_total = z_total + _full(z_part.detach())
                if grad_hidden is not None:
                    grad_hidden[span] = grads[0]
                if weight.requires_grad:
                    grad_weight = grads[1] if grad_weight is None else grad_weight.add_(grads[1])
                part = part.detach()
                total = part if total is None else total + part
                del grads, x, piece, z_part
        assert total is not None, "no tokens"
        # The layout of the hidden states' gradient, not the tensor (the graph keeps that).
        layout = (hidden.device_mesh, hidden.placements) if isinstance(hidden, DTensor) else None
        ctx.hidden_layout = (layout, local.shape)
        ctx.grads = (grad_hidden, grad_weight)
        ctx.mark_non_differentiable(z_total)
        return total, z_total

    @staticmethod
    def backward(ctx: Any, grad_total: torch.Tensor, _grad_z: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor | None, ...]:
        from torch.distributed.tensor import DTensor

        if ctx.grads is None:
            raise RuntimeError("the chunked loss's gradients were already used: backward runs once per forward")
        grad_hidden, grad_weight = ctx.grads
        ctx.grads = None  # scaled in place below: a second backward would be wrong
        scale = _local(grad_total)
        layout, shape = ctx.hidden_layout
        out_hidden: torch.Tensor | None = None
        if grad_hidden is not None:
            grad_hidden = grad_hidden.mul_(scale).reshape(shape)
            out_hidden = (grad_hidden if layout is None
                          else DTensor.from_local(grad_hidden, layout[0], layout[1], run_check=False))
        if isinstance(grad_weight, DTensor):
            grad_weight = DTensor.from_local(grad_weight.to_local().mul_(scale), grad_weight.device_mesh,
                                             grad_weight.placements, run_check=False)
        elif grad_weight is not None:
            grad_weight = grad_weight.mul_(scale)
        return out_hidden, grad_weight, None, None, None, None


def _full(t: torch.Tensor) -> torch.Tensor:
    """A replicated DTensor's value as a plain tensor (the z-loss sum of vocabulary-sharded logits)."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t

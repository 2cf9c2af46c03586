"""The z-loss (``[stability] z_loss``): ``coeff * mean over the valid tokens of logsumexp(logits)**2``.

Added to the trained loss it pulls the softmax normaliser towards 1 (log Z towards 0), which keeps
the output logits from drifting to large values in long runs (PaLM, section 5).

The loss tensor a micro-batch hands on keeps the cross-entropy as its *value* and gets the z-loss in
its *gradient* only: ``ce + (z - z.detach())`` is ``ce`` to the bit (``z - z`` is exactly 0 for a
finite ``z``), and its gradient is that of ``ce + z``. So everything downstream (the weighting per
valid token of the step and across data-parallel ranks in token_loss.py, gradient accumulation, a
pipeline schedule's loss) treats the z-loss exactly as the cross-entropy, and the logged ``loss``
stays plain cross-entropy, comparable with runs without it. The chunked loss (chunked_loss.py) does
the same inside its own autograd function.

The z-loss itself is summed on the device per step (no host read) and reduced and read only on
logging steps: ``z_loss`` in the metrics record, the step's value per valid token.
"""

from __future__ import annotations

import torch

from ..models.loss import IGNORE_INDEX


def logsumexp_squared_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum over the tokens whose label is valid (not ``IGNORE_INDEX``) of ``logsumexp(logits)**2``, in float32.

    ``logits`` [..., vocab] (a vocabulary-sharded DTensor under loss parallel works: torch reduces it),
    ``labels`` of the same leading shape."""
    lse = torch.logsumexp(logits.float(), dim=-1).reshape(-1)
    valid = labels.reshape(-1).ne(IGNORE_INDEX)
    if _is_dtensor(lse):  # the replicated log-normalisers: mask them as a plain tensor would be
        from torch.distributed.tensor import DTensor, Replicate

        assert isinstance(lse, DTensor)
        lse = lse.redistribute(placements=[Replicate()] * lse.device_mesh.ndim).to_local()
    return torch.where(valid, lse.square(), torch.zeros((), dtype=lse.dtype, device=lse.device)).sum()


def _is_dtensor(t: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def laid_out_like(loss: torch.Tensor, term: torch.Tensor) -> torch.Tensor:
    """``term`` (a plain scalar) as a replicated DTensor when ``loss`` is one (a loss on vocabulary-sharded
    logits), so the two add; else ``term`` itself."""
    from torch.distributed.tensor import DTensor, Replicate

    if not isinstance(loss, DTensor):
        return term
    return DTensor.from_local(term, loss.device_mesh, [Replicate()] * loss.device_mesh.ndim, run_check=False)


def gradient_only(value: torch.Tensor, term: torch.Tensor) -> torch.Tensor:
    """``value``, whose gradient also holds that of ``term``: the value is unchanged to the bit."""
    return value + (term - term.detach())


class ZLoss:
    """The run's z-loss: folded into each micro-batch's loss, summed on the device per step, read when logged."""

    def __init__(self, coeff: float, device: torch.device) -> None:
        self.coeff = coeff
        self.device = device
        self.sums: list[torch.Tensor] = []  # this step's, one per loss computed: coeff * sum of lse**2, this rank

    @property
    def enabled(self) -> bool:
        return self.coeff > 0

    def start_step(self) -> None:
        self.sums = []

    def record(self, z_sum: torch.Tensor) -> None:
        """A micro-batch's ``coeff * sum of lse**2`` (detached), kept on the device."""
        if self.enabled and torch.is_grad_enabled():
            self.sums.append(z_sum.detach().double().reshape(()))

    def mark(self) -> int:
        return len(self.sums)

    def keep_last_since(self, mark: int, count: int) -> None:
        """Of the sums recorded since ``mark``, keep the last ``count``: a pipeline schedule computes one loss per
        microbatch, but torch's first step also calls the loss once more to infer the backward's shapes."""
        extra = len(self.sums) - mark - count
        if extra > 0:
            del self.sums[mark:mark + extra]

    def fold(self, loss: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor, *, valid: int) -> torch.Tensor:
        """``loss`` (the micro-batch's mean over its ``valid`` labels) with the z-loss of ``logits`` in its
        gradient. Training only: under no_grad (validation) and with no valid label, ``loss`` as it is."""
        if not self.enabled or not torch.is_grad_enabled() or valid == 0:
            return loss
        z_sum = self.coeff * logsumexp_squared_sum(logits, labels)
        self.record(z_sum)
        return gradient_only(loss, laid_out_like(loss, z_sum / valid))

    def step_value(self, *, global_valid: int | torch.Tensor, tp: int, distributed: bool) -> float:
        """The last step's z-loss per valid token of the whole step (all data-parallel ranks): a collective over
        every rank when ``distributed`` (pipeline ranks without the last stage add 0, ``tp`` ranks repeat)."""
        total = torch.stack(self.sums).sum() if self.sums else torch.zeros((), dtype=torch.float64, device=self.device)
        if distributed:
            import torch.distributed as dist

            dist.all_reduce(total, op=dist.ReduceOp.SUM)
        count = global_valid.double() if isinstance(global_valid, torch.Tensor) else float(global_valid)
        return float(total / tp / count) if (isinstance(count, torch.Tensor) or count) else float("nan")

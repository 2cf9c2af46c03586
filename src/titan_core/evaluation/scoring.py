"""Score requests with a model: the summed log-probability of each request's targets, and whether
each target was the most likely token.

The requests are sorted longest first (less padding) and dealt to the data-parallel ranks in
turn; each rank runs its share in batches, right-padded (a causal model's earlier positions do
not see the padding). Every rank then runs the same number of forwards (a rank with fewer
requests runs a one-token dummy batch), because FSDP2 and expert parallelism gather inside the
forward. Each score is written into a vector that is zero elsewhere and the vectors are summed
over the ranks: x + 0 is x, so the gathered scores are each rank's own figures, exactly. Under
pipeline parallelism every stage runs the same batches and only the last stage's rank holds the
logits; its scores are summed over the stages the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .requests import Request

# The model's forward: input ids [batch, seq] on the device -> logits [batch, seq, vocab] (plain tensor), or None
# on a rank that runs its part of the forward but does not hold the logits (a pipeline stage before the last).
Forward = Callable[[torch.Tensor], torch.Tensor | None]


@dataclass(frozen=True)
class ScoreLayout:
    """Where this process stands among the ranks that split the requests."""

    dp_rank: int = 0
    dp: int = 1
    group: Any = None  # the data-parallel process group to sum over; None: a single data-parallel rank
    # Batches are padded to a multiple of this length: tensor parallelism's sequence-parallel regions split
    # the sequence over the TP ranks, evenly.
    width_multiple: int = 1
    # Pipeline parallelism: the stages' group; the logits exist on the last stage's rank only, whose scores are
    # summed over this group (the other stages add zeros). None without pipelining.
    stage_group: Any = None


ONE_PROCESS = ScoreLayout()


@dataclass(frozen=True)
class Scores:
    loglikelihood: list[float]  # summed over each request's targets (natural log)
    greedy: list[bool]  # every target was the argmax of its logits


def score_requests(requests: Sequence[Request], forward: Forward, *, window: int, batch_size: int,
                   device: torch.device, pad_id: int, layout: ScoreLayout = ONE_PROCESS) -> Scores:
    order = sorted(range(len(requests)), key=lambda i: -len(requests[i].tokens(window)))
    mine = order[layout.dp_rank::layout.dp]
    batches = -(-len(order[::layout.dp]) // batch_size)  # the most any rank runs
    out = torch.zeros(len(requests), 2, dtype=torch.float64, device=device)
    for b in range(batches):
        chunk = mine[b * batch_size:(b + 1) * batch_size]
        if not chunk:
            forward(torch.full((1, layout.width_multiple), pad_id, dtype=torch.long, device=device))  # the gathers the others wait for
            continue
        rows = [requests[i].tokens(window) for i in chunk]
        width = -(-max(len(r) for r in rows) // layout.width_multiple) * layout.width_multiple
        inputs = torch.full((len(rows), width), pad_id, dtype=torch.long)
        for j, row in enumerate(rows):
            inputs[j, :len(row)] = torch.tensor(row, dtype=torch.long)
        logits = forward(inputs.to(device))
        if logits is None:  # an earlier pipeline stage: the last stage's rank scores this batch
            continue
        for j, i in enumerate(chunk):
            n, targets = len(rows[j]), requests[i].targets
            picked = logits[j, n - len(targets):n].float()
            logprobs = torch.log_softmax(picked, dim=-1)
            wanted = torch.tensor(targets, dtype=torch.long, device=logprobs.device)
            out[i, 0] = logprobs.gather(-1, wanted[:, None]).double().sum()
            out[i, 1] = float(bool((picked.argmax(dim=-1) == wanted).all()))
    if layout.dp > 1:
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=layout.group)
    if layout.stage_group is not None:
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=layout.stage_group)
    values = out.cpu()
    return Scores(values[:, 0].tolist(), [bool(g) for g in values[:, 1].tolist()])

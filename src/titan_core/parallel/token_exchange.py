"""Expert parallelism's token traffic: each token goes to the rank that holds its expert and back.

An EP group of ``ep`` ranks splits the ``E`` experts of a layer into ``ep`` equal runs
(rank j holds experts ``j*E/ep .. (j+1)*E/ep - 1``). The MoE block hands its experts the
tokens sorted by global expert id with the count per expert; :func:`exchange_through_experts`

1. swaps the counts (one all-to-all of ``E`` integers), so each rank learns how many rows
   every peer sends to each of its experts;
2. sends each run of rows to its expert's rank (``all_to_all_single`` with uneven splits,
   which gloo and nccl both do);
3. reorders what arrived (by source rank, then expert) to expert-major order, runs the local
   experts on it, and puts the rows back in arrival order;
4. sends every row back to the rank it came from, in the order it left.

The two row exchanges are differentiable (:class:`_AllToAll`: backward is the same exchange
with the splits swapped), so gradients reach both the tokens' ranks and the experts' weights.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist


class _AllToAll(torch.autograd.Function):
    """Rows of ``x`` out in runs of ``send`` rows per rank; ``recv`` rows in from each rank."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, send: list[int], recv: list[int], group: dist.ProcessGroup) -> torch.Tensor:
        ctx.send, ctx.recv, ctx.group = send, recv, group
        return _exchange(x, send, recv, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        # Each received row's gradient goes back to the rank that sent the row.
        return _exchange(grad, ctx.recv, ctx.send, ctx.group), None, None, None


def _all_to_all(x: torch.Tensor, send: list[int], recv: list[int], group: dist.ProcessGroup) -> torch.Tensor:
    out: torch.Tensor = _AllToAll.apply(x, send, recv, group)  # type: ignore[no-untyped-call]  # torch leaves apply untyped
    return out


def _exchange(x: torch.Tensor, send: list[int], recv: list[int], group: dist.ProcessGroup) -> torch.Tensor:
    out = x.new_empty((sum(recv), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send, group=group)
    return out


def exchange_through_experts(x: torch.Tensor, counts: torch.Tensor, local_experts: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                             group: dist.ProcessGroup) -> torch.Tensor:
    """The local experts' output for every row of ``x``, wherever its expert lives.

    ``x``: this rank's rows sorted by global expert id; ``counts``: rows per global expert
    ([E]); ``local_experts(rows, counts)``: this rank's experts on rows sorted by local
    expert id. Returns one output row per row of ``x``, in ``x``'s order.
    """
    ep = dist.get_world_size(group)
    per_rank = counts.numel() // ep  # experts held by each rank
    # [source rank, local expert]: rows every peer sends to each of this rank's experts.
    incoming = torch.empty_like(counts)
    dist.all_to_all_single(incoming, counts.contiguous(), group=group)
    incoming = incoming.view(ep, per_rank)
    send = [int(n) for n in counts.view(ep, per_rank).sum(1).tolist()]
    recv = [int(n) for n in incoming.sum(1).tolist()]

    arrived = _all_to_all(x, send, recv, group)
    # Arrived rows come in runs of (source, expert), source-major; the experts want them
    # expert-major. A stable sort on (expert, source) keeps each run's order.
    run = torch.repeat_interleave(torch.arange(ep * per_rank, device=x.device), incoming.flatten().to(x.device))
    order = torch.argsort((run % per_rank) * ep + run // per_rank, stable=True)
    out = local_experts(arrived[order], incoming.sum(0))
    back = torch.empty_like(order)
    back[order] = torch.arange(order.numel(), device=order.device)
    return _all_to_all(out[back], recv, send, group)

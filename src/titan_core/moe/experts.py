"""Experts stored as stacked weights: SwiGLU per expert, computed by grouped GEMM.

``w1`` (gate) and ``w3`` (up) are [experts, hidden, dim], ``w2`` (down) is
[experts, dim, hidden]: each expert's slice is an ``nn.Linear`` weight, so a Hugging Face
per-expert tensor is one slice. These are plain parameters, not ``nn.Linear`` modules, so
converters that rewrite linear layers leave them alone.

Under autocast the tokens and the (plain) weights are cast to the autocast dtype first, as
torchtitan does: autocast does not cover ``torch._grouped_mm``, so without the cast a
single-GPU run (no FSDP mixed precision) would feed it float32 and fall back to the
per-expert loop. ``last_path`` names the path the last forward took ("grouped_mm" or
"loop"); the MoE monitor reports it (``moe_grouped_mm`` in the metrics).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .grouped_mm import grouped_linear, takes_grouped_mm


class GroupedExperts(nn.Module):
    """Tokens sorted by expert [n, dim] + rows per expert [experts] -> each token's expert output [n, dim]."""

    def __init__(self, dim: int, hidden_dim: int, num_experts: int) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.w1 = nn.Parameter(torch.empty(num_experts, hidden_dim, dim))
        self.w2 = nn.Parameter(torch.empty(num_experts, dim, hidden_dim))
        self.w3 = nn.Parameter(torch.empty(num_experts, hidden_dim, dim))
        self.last_path = ""  # "grouped_mm" or "loop" once a forward ran

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        w1, w2, w3 = _local(self.w1), _local(self.w2), _local(self.w3)
        device = x.device.type
        if device != "meta" and torch.is_autocast_enabled(device):  # meta (the memory plan's probe) has no autocast
            dtype = torch.get_autocast_dtype(device)
            x = x.to(dtype)
            # A converter's weight subclass (e.g. MXFP8) casts itself inside its own grouped GEMM.
            w1, w2, w3 = (w.to(dtype) if type(w) in (torch.Tensor, nn.Parameter) else w for w in (w1, w2, w3))
        self.last_path = "grouped_mm" if takes_grouped_mm(x, w1) else "loop"
        gate = grouped_linear(x, w1, counts)
        up = grouped_linear(x, w3, counts)
        return grouped_linear(F.silu(gate) * up, w2, counts)


def _local(weight: torch.Tensor) -> torch.Tensor:
    """The plain tensor of a weight (a DTensor sharded over experts gives its own experts)."""
    to_local = getattr(weight, "to_local", None)
    return to_local() if callable(to_local) else weight

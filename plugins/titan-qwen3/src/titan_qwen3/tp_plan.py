"""Tensor parallelism (with sequence parallelism) for the Qwen3 module layout.

titan-core's layouts (``titan_core.parallel.tp_plans``) with Qwen3's module names:

* attention: q/k/v column-wise (each rank holds whole heads: ``tp`` must divide the query
  and the key/value heads, so grouped-query pairs stay on one rank), ``wo`` row-wise; the
  QK-norms run on the local heads with a replicated weight whose gradient is summed over tp;
* a dense MLP: ``w1``/``w3`` column-wise, ``w2`` row-wise;
* a MoE block (router, experts, shared experts): replicated. Every tp rank all-gathers the
  sequence, routes and computes every token itself and keeps its own slice of the output:
  TP shards the dense parts only (sharding experts is expert parallelism's job).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from titan_core import TensorParallelStyles
from titan_core.parallel.tp_plans import (
    decoder_plan,
    head_sharded_norm,
    mlp_plan,
    sequence_parallel_norm,
    sharded_sublayer_plan,
)


def block_plan(block: nn.Module, styles: TensorParallelStyles) -> dict[str, Any]:
    """The TP plan of one TransformerBlock (keys relative to the block)."""
    return {
        "attention_norm": sequence_parallel_norm(),
        **sharded_sublayer_plan(block, "attention", styles, colwise=("wq", "wk", "wv"), rowwise=("wo",)),
        "attention.q_norm": head_sharded_norm(),
        "attention.k_norm": head_sharded_norm(),
        **mlp_plan(block, styles),
    }


def qwen3_tp_plan(model: nn.Module, *, styles: TensorParallelStyles, loss_parallel: bool) -> dict[str, Any]:
    """The TP plan of ``model`` (a whole Transformer or one pipeline stage of it), keys relative to it."""
    return decoder_plan(model, styles, loss_parallel=loss_parallel, block_plan=block_plan)

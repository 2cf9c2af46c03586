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
    head_sharded_norm,
    outer_plan,
    prefixed,
    replicated_sublayer_plan,
    sequence_parallel_norm,
    sharded_sublayer_plan,
)


def block_plan(block: nn.Module, styles: TensorParallelStyles) -> dict[str, Any]:
    """The TP plan of one TransformerBlock (keys relative to the block)."""
    plan = {
        "attention_norm": sequence_parallel_norm(),
        **sharded_sublayer_plan(block, "attention", styles, colwise=("wq", "wk", "wv"), rowwise=("wo",)),
        "attention.q_norm": head_sharded_norm(),
        "attention.k_norm": head_sharded_norm(),
        "ffn_norm": sequence_parallel_norm(),
    }
    if getattr(block, "moe", None) is not None:
        plan.update(replicated_sublayer_plan("moe"))
    else:
        plan.update(sharded_sublayer_plan(block, "feed_forward", styles, colwise=("w1", "w3"), rowwise=("w2",)))
    return plan


def qwen3_tp_plan(model: nn.Module, *, styles: TensorParallelStyles, loss_parallel: bool) -> dict[str, Any]:
    """The TP plan of ``model`` (a whole Transformer or one pipeline stage of it), keys relative to it."""
    plan = outer_plan(model, loss_parallel=loss_parallel)
    for name, block in model.get_submodule("layers").named_children():
        plan.update(prefixed(f"layers.{name}", block_plan(block, styles)))
    return plan

"""Tensor parallelism (with sequence parallelism) for the Llama module layout.

The layouts (a sequence-sharded residual stream, column- then row-wise linears in
attention and the MLP, a vocabulary-sharded head) are titan-core's
(``titan_core.parallel.tp_plans``); this module names Llama's modules.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from titan_core import TensorParallelStyles
from titan_core.parallel.tp_plans import outer_plan, prefixed, sequence_parallel_norm, sharded_sublayer_plan


def block_plan(block: nn.Module, styles: TensorParallelStyles) -> dict[str, Any]:
    """The TP plan of one TransformerBlock (keys relative to the block)."""
    return {
        "attention_norm": sequence_parallel_norm(),
        **sharded_sublayer_plan(block, "attention", styles, colwise=("wq", "wk", "wv"), rowwise=("wo",)),
        "ffn_norm": sequence_parallel_norm(),
        **sharded_sublayer_plan(block, "feed_forward", styles, colwise=("w1", "w3"), rowwise=("w2",)),
    }


def llama_tp_plan(model: nn.Module, *, styles: TensorParallelStyles, loss_parallel: bool) -> dict[str, Any]:
    """The TP plan of ``model`` (a whole Transformer or one pipeline stage of it), keys relative to it."""
    plan = outer_plan(model, loss_parallel=loss_parallel)
    for name, block in model.get_submodule("layers").named_children():
        plan.update(prefixed(f"layers.{name}", block_plan(block, styles)))
    return plan

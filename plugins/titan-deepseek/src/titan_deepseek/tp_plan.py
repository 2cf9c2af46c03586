"""Tensor parallelism (with sequence parallelism) for the DeepSeek-V3 module layout.

titan-core's layouts (``titan_core.parallel.tp_plans``) with this model's module names:

* multi-head latent attention: each rank holds whole heads. The query up-projection (``wq_b``,
  or ``wq`` without a query bottleneck) and the key/value up-projection ``wkv_b`` are column-wise,
  ``wo`` row-wise. The down-projections (``wq_a``, ``wkv_a``) and the latent norms are small
  (a rank of 64-1536 channels) and run replicated on the whole gathered sequence, as plain
  weights that every tp rank keeps the same: their gradients arrive whole, through the column-wise
  layers' input gradients, except the rotary key's, which every head shares and each rank sees
  only its heads' part of; ``summed_tail_gradient`` sums that part over the tp ranks.
* a dense MLP: ``w1``/``w3`` column-wise, ``w2`` row-wise;
* a MoE block (router, experts, shared experts): replicated, as qwen3's: TP shards the dense
  parts only (experts split over ``parallelism.ep``).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from titan_core import TensorParallelStyles
from titan_core.parallel.tp_plans import (
    decoder_plan,
    gather_first_input_local,
    mlp_plan,
    sequence_parallel_norm,
    summed_tail_gradient,
)

from .model import MultiHeadLatentAttention


def attention_plan(attention: nn.Module, styles: TensorParallelStyles) -> dict[str, Any]:
    """The plan of one MultiHeadLatentAttention (keys relative to the block)."""
    from torch.distributed.tensor import Shard

    assert isinstance(attention, MultiHeadLatentAttention), type(attention)  # converters swap linears, not this
    query = "wq" if attention.wq is not None else "wq_b"
    return {
        # the block passes (x, rope, cache, start): the hidden state gathered, the rest as they are
        "attention": gather_first_input_local(attention, inputs=4),
        f"attention.{query}": styles.colwise(),
        "attention.wkv_a": summed_tail_gradient(attention.rope_dim),
        "attention.wkv_b": styles.colwise(),
        "attention.wo": styles.rowwise(output_layouts=Shard(1)),
    }


def block_plan(block: nn.Module, styles: TensorParallelStyles) -> dict[str, Any]:
    """The TP plan of one TransformerBlock (keys relative to the block)."""
    return {
        "attention_norm": sequence_parallel_norm(),
        **attention_plan(block.get_submodule("attention"), styles),
        **mlp_plan(block, styles),
    }


def deepseek_v3_tp_plan(model: nn.Module, *, styles: TensorParallelStyles, loss_parallel: bool) -> dict[str, Any]:
    """The TP plan of ``model`` (a whole Transformer or one pipeline stage of it), keys relative to it."""
    return decoder_plan(model, styles, loss_parallel=loss_parallel, block_plan=block_plan)

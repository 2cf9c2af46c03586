"""TinyGPT's tensor-parallel plan: Megatron-style column-then-row linears, no sequence parallelism.

Between blocks the residual stream is a plain tensor, replicated on every tp
rank ([batch, seq, dim]). In each block the q/k/v projections and the MLP's
``fc_in`` are column-wise (each rank computes its own heads / its slice of the
hidden width, as a plain local tensor); ``wo`` and ``fc_out`` are row-wise and
all-reduce back to the replicated residual stream. The embeddings and the layer
norms stay whole on every rank. The head is column-wise over the vocabulary: with
``loss_parallel`` its logits stay a DTensor sharded on the last dimension
(``Shard(-1)``), which the core's cross-entropy consumes under ``loss_parallel()``;
otherwise they are gathered into a plain full tensor.

Heads split evenly only when tp divides n_heads (``validate_tinygpt`` checks).
Converter styles (``styles``) apply to the block linears; the head keeps torch's.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from titan_core import TensorParallelStyles


def tinygpt_tp_plan(model: nn.Module, *, styles: TensorParallelStyles, loss_parallel: bool) -> dict[str, Any]:
    """``{module name: ParallelStyle}`` for a whole TinyGPT (it has no pipeline stages)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel

    plan: dict[str, Any] = {}
    for name, _ in model.get_submodule("layers").named_children():
        block = f"layers.{name}"
        plan.update({
            f"{block}.attn.wq": styles.colwise(),
            f"{block}.attn.wk": styles.colwise(),
            f"{block}.attn.wv": styles.colwise(),
            f"{block}.attn.wo": styles.rowwise(),
            f"{block}.mlp.fc_in": styles.colwise(),
            f"{block}.mlp.fc_out": styles.rowwise(),
        })
    plan["output"] = ColwiseParallel(
        output_layouts=Shard(-1) if loss_parallel else Replicate(),
        use_local_output=not loss_parallel,
    )
    return plan

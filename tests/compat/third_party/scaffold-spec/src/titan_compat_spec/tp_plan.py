"""The tensor-parallel plan: ``{module name: ParallelStyle}`` for titan-core's default parallelize_fn.

Column-wise q/k/v, w1 and w3 (each rank computes its own heads and its slice of the MLP),
row-wise wo and w2 (all-reduced back to the replicated residual stream); the
embedding and the norms stay whole on every rank. The head is column-wise over the
vocabulary: with ``loss_parallel`` its logits stay a DTensor sharded on the last
dimension, which the core's loss consumes under ``loss_parallel()``.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from titan_core import TensorParallelStyles


def compat_spec_tp_plan(model: nn.Module, *, styles: TensorParallelStyles, loss_parallel: bool) -> dict[str, Any]:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel

    plan: dict[str, Any] = {}
    for name, _ in model.get_submodule("layers").named_children():
        p = f"layers.{name}"
        plan.update({
            f"{p}.attention.wq": styles.colwise(), f"{p}.attention.wk": styles.colwise(),
            f"{p}.attention.wv": styles.colwise(), f"{p}.attention.wo": styles.rowwise(),
            f"{p}.feed_forward.w1": styles.colwise(), f"{p}.feed_forward.w2": styles.rowwise(),
            f"{p}.feed_forward.w3": styles.colwise(),
        })
    plan["output"] = ColwiseParallel(output_layouts=Shard(-1) if loss_parallel else Replicate(),
                                     use_local_output=not loss_parallel)
    return plan

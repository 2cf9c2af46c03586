"""Tensor parallelism (with sequence parallelism) for the Llama module layout.

Layout of the residual stream between blocks: a plain local tensor holding this
rank's slice of the sequence, ``[batch, seq_len / tp, dim]`` (``Shard(1)``). The
norms run sequence-parallel on that slice; attention and the MLP all-gather it
(``Shard(1) -> Replicate``), run column-wise then row-wise linears, and
reduce-scatter back to ``Shard(1)``. Pipeline stages therefore pass (and
receive) sequence-sharded hidden states.

The output head is column-wise: with ``loss_parallel`` its logits stay a DTensor
sharded on the vocabulary (``Shard(-1)``), to be consumed by cross-entropy under
``torch.distributed.tensor.parallel.loss_parallel()``; otherwise they are
all-gathered into a plain full ``[batch, seq_len, vocab]`` tensor.
"""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

from titan_core import TensorParallelStyles


def _positional_arity(module: nn.Module) -> int:
    """Number of positional inputs ``module.forward`` takes (PrepareModuleInput needs one layout each)."""
    params = list(inspect.signature(module.forward).parameters.values())
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in params if p.kind in kinds and p.default is inspect.Parameter.empty)


def _gather_first_input(styles: TensorParallelStyles, module: nn.Module) -> Any:
    """All-gather the sequence-sharded hidden state (first input); leave other inputs (freqs_cis) alone."""
    n = _positional_arity(module)
    rest: tuple[None, ...] = (None,) * (n - 1)
    return styles.prepare_module_input(
        input_layouts=(Shard(1), *rest),
        desired_input_layouts=(Replicate(), *rest),
    )


def block_plan(block: nn.Module, styles: TensorParallelStyles) -> dict[str, Any]:
    """The TP plan of one TransformerBlock (keys relative to the block)."""
    return {
        "attention_norm": SequenceParallel(),
        "attention": _gather_first_input(styles, block.get_submodule("attention")),
        "attention.wq": styles.colwise(),
        "attention.wk": styles.colwise(),
        "attention.wv": styles.colwise(),
        "attention.wo": styles.rowwise(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": _gather_first_input(styles, block.get_submodule("feed_forward")),
        "feed_forward.w1": styles.colwise(),
        "feed_forward.w2": styles.rowwise(output_layouts=Shard(1)),
        "feed_forward.w3": styles.colwise(),
    }


def outer_plan(model: nn.Module, *, loss_parallel: bool) -> dict[str, Any]:
    """The TP plan of the embedding, final norm and output head (those present in this part).

    These use torch's own styles even when a converter supplies others: converters
    rewrite the blocks' linears, never the embedding or the head (an embedding is
    not a linear, and the head is where precision matters most).
    """
    plan: dict[str, Any] = {}
    if getattr(model, "tok_embeddings", None) is not None:
        # Vocabulary-sharded table; the partial sums are reduce-scattered straight
        # into the sequence-sharded residual stream.
        plan["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
    if getattr(model, "norm", None) is not None:
        plan["norm"] = SequenceParallel()
    if getattr(model, "output", None) is not None:
        plan["output"] = ColwiseParallel(
            input_layouts=Shard(1),
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        )
    return plan


def llama_tp_plan(model: nn.Module, *, styles: TensorParallelStyles, loss_parallel: bool) -> dict[str, Any]:
    """The TP plan of ``model`` (a whole Transformer or one pipeline stage of it), keys relative to it."""
    plan = outer_plan(model, loss_parallel=loss_parallel)
    for name, block in model.get_submodule("layers").named_children():
        plan.update({f"layers.{name}.{key}": style for key, style in block_plan(block, styles).items()})
    return plan

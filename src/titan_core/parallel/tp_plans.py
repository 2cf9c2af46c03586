"""Building blocks of a tensor-parallel plan for a pre-norm decoder with sequence parallelism.

Layout of the residual stream between blocks: a plain local tensor holding this rank's
slice of the sequence, ``[batch, seq_len / tp, dim]`` (``Shard(1)``). The norms run
sequence-parallel on that slice; a sharded sub-layer (attention, a dense MLP) all-gathers
it (``Shard(1) -> Replicate``), runs column-wise then row-wise linears, and reduce-scatters
back to ``Shard(1)``. Pipeline stages therefore pass (and receive) sequence-sharded hidden
states. A spec's ``tp_plan_fn`` composes these pieces with its own module names; the keys
are module names relative to the part it is given.

The output head is column-wise: with ``loss_parallel`` its logits stay a DTensor sharded on
the vocabulary (``Shard(-1)``), to be consumed by cross-entropy under
``torch.distributed.tensor.parallel.loss_parallel()``; otherwise they are all-gathered into
a plain full ``[batch, seq_len, vocab]`` tensor.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from torch import nn

from ..plugin.protocols import TensorParallelStyles


def _positional_arity(module: nn.Module) -> int:
    """Number of positional inputs ``module.forward`` takes (PrepareModuleInput needs one layout each)."""
    params = list(inspect.signature(module.forward).parameters.values())
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in params if p.kind in kinds and p.default is inspect.Parameter.empty)


def gather_first_input(styles: TensorParallelStyles, module: nn.Module) -> Any:
    """All-gather the sequence-sharded hidden state (first input); leave other inputs (a rotary table) alone."""
    from torch.distributed.tensor import Replicate, Shard

    rest: tuple[None, ...] = (None,) * (_positional_arity(module) - 1)
    return styles.prepare_module_input(input_layouts=(Shard(1), *rest), desired_input_layouts=(Replicate(), *rest))


def sharded_sublayer_plan(block: nn.Module, name: str, styles: TensorParallelStyles, *,
                          colwise: Sequence[str], rowwise: Sequence[str]) -> dict[str, Any]:
    """Plan of ``block.<name>``: gather its input, shard ``colwise`` linears by output and
    ``rowwise`` ones by input (their output reduce-scattered back onto the sequence)."""
    from torch.distributed.tensor import Shard

    plan: dict[str, Any] = {name: gather_first_input(styles, block.get_submodule(name))}
    plan.update({f"{name}.{linear}": styles.colwise() for linear in colwise})
    plan.update({f"{name}.{linear}": styles.rowwise(output_layouts=Shard(1)) for linear in rowwise})
    return plan


def replicated_sublayer_plan(name: str) -> dict[str, Any]:
    """Plan of a sub-layer every tp rank runs whole (e.g. a MoE block): its input is all-gathered
    from the sequence shards, and each rank keeps its own slice of the (identical) output.

    Its parameters stay plain tensors, the same on every tp rank; each rank computes the same
    gradient for them from the whole sequence, so no reduction over tp is needed.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInputOutput

    return {name: PrepareModuleInputOutput(
        input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_input=True,
        output_layouts=(Replicate(),), desired_output_layouts=(Shard(1),), use_local_output=True,
    )}


def sequence_parallel_norm() -> Any:
    """A norm over the last dimension of the sequence-sharded residual stream."""
    from torch.distributed.tensor.parallel import SequenceParallel

    return SequenceParallel()


def head_sharded_norm() -> Any:
    """A norm over each head's channels (QK-norm) after a column-wise projection: its input
    [batch, seq, local heads, head_dim] is sharded on the heads (dim 2). Its weight becomes a
    replicated DTensor, so the gradient each rank takes from its own heads is summed over tp."""
    from torch.distributed.tensor.parallel import SequenceParallel

    # SequenceParallel shards any one dimension; here the heads', not the sequence's.
    return SequenceParallel(sequence_dim=2, use_local_output=True)


def outer_plan(model: nn.Module, *, loss_parallel: bool, embedding: str = "tok_embeddings", norm: str = "norm",
               output: str = "output") -> dict[str, Any]:
    """The plan of the embedding, final norm and output head (those present in this part).

    These use torch's own styles even when a converter supplies others: converters rewrite
    the blocks' linears, never the embedding or the head (an embedding is not a linear, and
    the head is where precision matters most).
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan: dict[str, Any] = {}
    if getattr(model, embedding, None) is not None:
        # Vocabulary-sharded table; the partial sums are reduce-scattered straight into the
        # sequence-sharded residual stream.
        plan[embedding] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
    if getattr(model, norm, None) is not None:
        plan[norm] = sequence_parallel_norm()
    if getattr(model, output, None) is not None:
        plan[output] = ColwiseParallel(
            input_layouts=Shard(1),
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        )
    return plan


def prefixed(prefix: str, plan: dict[str, Any]) -> dict[str, Any]:
    """``plan`` with every key under ``prefix`` (e.g. a block's plan under ``layers.3``)."""
    return {f"{prefix}.{key}": style for key, style in plan.items()}


__all__ = [
    "gather_first_input",
    "head_sharded_norm",
    "outer_plan",
    "prefixed",
    "replicated_sublayer_plan",
    "sequence_parallel_norm",
    "sharded_sublayer_plan",
]

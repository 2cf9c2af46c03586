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
from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from ..errors import ConfigError
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


def gather_first_input_local(module: nn.Module, *, inputs: int | None = None) -> Any:
    """As :func:`gather_first_input`, but the sub-layer receives a plain local tensor (the whole sequence):
    for a sub-layer that also runs replicated linears on its input (multi-head latent attention's
    down-projections), which cannot take a DTensor beside their plain weights. Its column-wise linears
    accept the local tensor as replicated. torch's own style: a converter's input style casts for
    consumers that are all its own linears, which such a sub-layer does not have. ``inputs``: how many
    positional inputs its caller passes, when more than the required ones (torch wants a layout each)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput

    rest: tuple[None, ...] = (None,) * ((inputs or _positional_arity(module)) - 1)
    return PrepareModuleInput(input_layouts=(Shard(1), *rest), desired_input_layouts=(Replicate(), *rest),
                              use_local_output=True)


def summed_tail_gradient(channels: int) -> Any:
    """For a replicated linear whose last ``channels`` output channels are shared by every head (multi-head
    latent attention's rotary key): in backward, the gradient of those channels is summed over the tp ranks.

    Each rank holds only its own heads, so each computes only its heads' part of that gradient; the other
    output channels feed column-wise linears, whose own backward already sums theirs. Without the sum the
    replicated weight, and the hidden state's gradient, would differ between tp ranks."""
    import torch
    from torch.distributed.tensor import DTensor, Partial, Replicate
    from torch.distributed.tensor.parallel import ParallelStyle

    class SummedTailGradient(ParallelStyle):
        # ``_apply`` is the method torch's ParallelStyle asks a style to define (not a private torch name
        # reached from outside: parallelize_module calls it).
        def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
            def sum_tail_gradient(_module: nn.Module, _inputs: Any, output: torch.Tensor) -> torch.Tensor:
                head, tail = output.split([output.shape[-1] - channels, channels], dim=-1)
                # Forward: the same local values. Backward: the local gradient is read as a partial sum,
                # which returning to the replicated layout all-reduces.
                shared = DTensor.from_local(tail, device_mesh, [Replicate()], run_check=False)
                return torch.cat([head, shared.to_local(grad_placements=[Partial()])], dim=-1)

            module.register_forward_hook(sum_tail_gradient)
            return module

    return SummedTailGradient()


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


def mlp_plan(block: nn.Module, styles: TensorParallelStyles) -> dict[str, Any]:
    """The plan of a block's norm and MLP: ``moe`` replicated when the block has one (TP shards the dense
    parts only; experts split over ``parallelism.ep``), else ``feed_forward`` sharded (``w1``/``w3``
    column-wise, ``w2`` row-wise)."""
    plan: dict[str, Any] = {"ffn_norm": sequence_parallel_norm()}
    if getattr(block, "moe", None) is not None:
        plan.update(replicated_sublayer_plan("moe"))
    else:
        plan.update(sharded_sublayer_plan(block, "feed_forward", styles, colwise=("w1", "w3"), rowwise=("w2",)))
    return plan


def decoder_plan(model: nn.Module, styles: TensorParallelStyles, *, loss_parallel: bool,
                 block_plan: Callable[[nn.Module, TensorParallelStyles], dict[str, Any]]) -> dict[str, Any]:
    """The plan of a decoder (or one pipeline stage of it): :func:`outer_plan` and ``block_plan`` of each of
    its ``layers``, keys relative to ``model``."""
    plan = outer_plan(model, loss_parallel=loss_parallel)
    for name, block in model.get_submodule("layers").named_children():
        plan.update(prefixed(f"layers.{name}", block_plan(block, styles)))
    return plan


def check_decoder_tp(tp: int, *, heads: Sequence[tuple[str, int | None]], vocab_size: int | None, seq_len: int,
                     dense_intermediate_size: int | None) -> None:
    """ConfigError naming the first size of a decoder that ``tp`` does not divide: its ``heads`` counts
    ((what, count) pairs: query heads, key/value heads), the vocabulary (the head and embedding are
    sharded on it), the sequence (sequence parallelism) and a dense MLP's width (None: no dense layer;
    MoE blocks are not sharded by TP). A None size is not known yet and not checked."""
    sizes = [*heads, ("model vocab_size", vocab_size),
             ("training.seq_len (sequence parallelism shards the sequence)", seq_len),
             ("the dense MLP's intermediate_size", dense_intermediate_size)]
    for what, value in sizes:
        if value is not None and value % tp:
            raise ConfigError(
                f"parallelism.tp={tp} does not divide {what}={value}: tensor parallelism splits it evenly "
                f"over the tp ranks. Choose a tp degree that divides it (or change the model)."
            )


def prefixed(prefix: str, plan: dict[str, Any]) -> dict[str, Any]:
    """``plan`` with every key under ``prefix`` (e.g. a block's plan under ``layers.3``)."""
    return {f"{prefix}.{key}": style for key, style in plan.items()}


__all__ = [
    "check_decoder_tp",
    "decoder_plan",
    "gather_first_input",
    "gather_first_input_local",
    "head_sharded_norm",
    "mlp_plan",
    "outer_plan",
    "prefixed",
    "replicated_sublayer_plan",
    "sequence_parallel_norm",
    "sharded_sublayer_plan",
    "summed_tail_gradient",
]

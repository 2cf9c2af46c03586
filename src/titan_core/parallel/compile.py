"""torch.compile per block, in place."""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

from ..moe import GroupedExperts


def apply_compile(blocks: Iterable[nn.Module], *, fullgraph: bool = True, eager_checkpoints: bool = False) -> None:
    """Compile each block in place.

    ``nn.Module.compile`` keeps the module (no ``_orig_mod`` wrapper), so parameter
    names are unchanged. Compiling blocks rather than the whole model keeps graphs
    small and lets identical blocks reuse one compilation.

    A block holding ``titan_core.moe`` experts is compiled around them
    (:func:`compile_around_experts`). With ``eager_checkpoints``, a checkpointed block keeps its
    checkpoint eager and its sub-modules are compiled instead: context parallelism recomputes a
    block under its attention redirect (a torch function mode), which compiled checkpointing refuses.
    """
    for block in blocks:
        if _holds_experts(block) or (eager_checkpoints and getattr(block, "_titan_checkpointed", False)):
            compile_around_experts(block, fullgraph=fullgraph)
        else:
            block.compile(fullgraph=fullgraph)


def compile_around_experts(module: nn.Module, *, fullgraph: bool = True) -> None:
    """Compile every sub-module of ``module`` that holds no experts; the experts and the
    modules around them (a MoE layer's dispatch and combine) run eagerly.

    Why: a MoE layer's dispatch is data-dependent (rows per expert decide the shapes, and
    under expert parallelism the all-to-all's uneven splits are Python lists read from a
    tensor), which a full graph cannot hold; and on CPU ``torch._grouped_mm``'s shape
    function accepts bfloat16 only, though its float32 kernel runs. The attention, norms,
    router and dense or shared MLPs around them are compiled as usual.
    """
    for child in module.children():
        if isinstance(child, GroupedExperts):
            continue
        if _holds_experts(child):
            compile_around_experts(child, fullgraph=fullgraph)
        else:
            child.compile(fullgraph=fullgraph)


def _holds_experts(module: nn.Module) -> bool:
    return any(isinstance(m, GroupedExperts) for m in module.modules())

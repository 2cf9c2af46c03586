"""torch.compile per block, in place."""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn


def apply_compile(blocks: Iterable[nn.Module], *, fullgraph: bool = True) -> None:
    """Compile each block in place.

    ``nn.Module.compile`` keeps the module (no ``_orig_mod`` wrapper), so parameter
    names are unchanged. Compiling blocks rather than the whole model keeps graphs
    small and lets identical blocks reuse one compilation.
    """
    for block in blocks:
        block.compile(fullgraph=fullgraph)

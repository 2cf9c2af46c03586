"""Counts the aten ops a block of code dispatches (recomputation under activation checkpointing shows as more)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode


class CountOps(TorchDispatchMode):
    """``with CountOps() as c: ...`` then ``c.counts["aten.mm.default"]``."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.counts[str(func)] += 1
        return func(*args, **(kwargs or {}))

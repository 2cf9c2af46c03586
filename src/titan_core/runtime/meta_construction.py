"""A model's constructor on meta without the work that has no result there.

Lives at the bottom layer because torch calls the mode from whatever code runs a torch function during
the construction (the model plugins, ``titan_core.models``): a call from there must not climb back up.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

__all__ = ["NoRandomFillsOnMeta"]

# Random fills, in place: on meta they produce no values, and torch runs them through Python
# reference kernels whose first call imports torch._dynamo (about 1 s of CPU per process, on
# every rank of every run). The values a run starts from are drawn later by ``init_model_weights``.
# The ``nn.init`` functions are listed as well as the tensor methods: a mode does not see the calls
# made inside a function it passed on.
_RANDOM_FILLS = frozenset({
    torch.Tensor.normal_, torch.Tensor.uniform_, torch.Tensor.exponential_, torch.Tensor.geometric_,
    torch.Tensor.cauchy_, torch.Tensor.log_normal_, torch.Tensor.random_, torch.Tensor.bernoulli_,
    nn.init.normal_, nn.init.uniform_, nn.init.trunc_normal_, nn.init.kaiming_uniform_, nn.init.kaiming_normal_,
    nn.init.xavier_uniform_, nn.init.xavier_normal_, nn.init.orthogonal_, nn.init.sparse_,
})


class NoRandomFillsOnMeta(TorchFunctionMode):
    """Skips in-place random fills of meta tensors during construction; everything else runs as usual."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _RANDOM_FILLS:
            target = args[0] if args else kwargs.get("tensor")  # nn.init passes its tensor by keyword
            if isinstance(target, torch.Tensor) and target.is_meta:
                return target
        return func(*args, **kwargs)

"""The values the core hands plugins, resolved: a run's dtypes as torch dtypes, and config sections holding
only the values their fields documented when they entered the plugin contract (docs/plugins.md).

``MixedPrecision`` is plugin API 1.1's ``precision``; ``promised_parallelism`` keeps
``parallelism.param_dtype`` to the values plugin API 1.0 documented.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from pydantic import BaseModel

__all__ = ["MixedPrecision", "dtype_name", "promised_parallelism", "resolve_compute_dtype", "resolve_mixed_precision",
           "resolve_param_dtype"]


def resolve_compute_dtype(setting: str, device: torch.device) -> torch.dtype:
    """``training.dtype`` as a torch dtype. ``auto`` is bfloat16 on CUDA and float32 elsewhere,
    because CPUs without AVX-512 BF16 / AMX run bfloat16 matmuls several times slower than fp32."""
    if setting == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    dtype: torch.dtype = getattr(torch, setting)  # "float32" / "bfloat16", checked by the config's Literal
    return dtype



_DTYPE_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class MixedPrecision:
    """The run's precision, resolved: what plugins receive instead of the config's strings (plugin API 1.1).

    ``compute_dtype`` is what the forward and backward compute in (``training.dtype``, ``auto``
    resolved for the run's device); ``param_dtype`` what FSDP2 all-gathers parameters in
    (``parallelism.param_dtype``, ``auto`` resolved to the compute dtype); ``reduce_dtype`` what
    gradients are reduced in. Master weights and optimizer state stay float32 whatever these say.
    """

    compute_dtype: torch.dtype
    param_dtype: torch.dtype
    reduce_dtype: torch.dtype

    def fsdp_policy(self) -> Any:
        """``torch.distributed.fsdp.MixedPrecisionPolicy`` with these dtypes (for a plugin's own ``fully_shard``)."""
        from torch.distributed.fsdp import MixedPrecisionPolicy  # start-up: only a parallelize_fn needs it

        return MixedPrecisionPolicy(param_dtype=self.param_dtype, reduce_dtype=self.reduce_dtype)


def resolve_param_dtype(setting: str, compute_dtype: torch.dtype) -> torch.dtype:
    """``parallelism.param_dtype`` as a torch dtype: ``auto`` gathers in the compute dtype (bfloat16 compute
    would otherwise gather float32 weights only to cast them, twice the all-gather traffic)."""
    if setting == "auto":
        return torch.bfloat16 if compute_dtype == torch.bfloat16 else torch.float32
    return _DTYPE_NAMES[setting]


def resolve_mixed_precision(*, dtype: str, param_dtype: str, reduce_dtype: str,
                            device: torch.device) -> MixedPrecision:
    """The config's three precision strings, resolved for ``device``."""
    compute = resolve_compute_dtype(dtype, device)
    return MixedPrecision(compute, resolve_param_dtype(param_dtype, compute), _DTYPE_NAMES[reduce_dtype])


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``: the config's spelling of a dtype."""
    return str(dtype).removeprefix("torch.")


SectionT = TypeVar("SectionT", bound=BaseModel)


def promised_parallelism(parallelism: SectionT, precision: MixedPrecision) -> SectionT:
    """``[parallelism]`` as plugins receive it: ``param_dtype`` one of the values plugin API 1.0 documented
    ("float32", "bfloat16"). ``auto``, added to the config later, becomes the dtype it resolves to, which
    means the same to FSDP2; a plugin mapping the field through its own table keeps working."""
    if getattr(parallelism, "param_dtype", None) != "auto":
        return parallelism
    return parallelism.model_copy(update={"param_dtype": dtype_name(precision.param_dtype)})

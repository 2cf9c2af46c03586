"""Resolve the ``auto`` settings of ``[float8]`` against the device, backend and parallelism.

Pure functions of the config and the run's facts, so every combination is
testable on a CPU: pass a RunContext that claims nccl and a ParallelDims with
dp_shard=2, and look at the result.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from titan_core import ConfigError, ParallelDims, RunContext
from titan_core.plugin.emulation import KernelNeeds, resolve_emulation

from . import hardware
from .config import Float8Config


@dataclass(frozen=True)
class Float8Settings:
    """What the float8 converter will actually do, and why."""

    recipe: str
    #: the process-group backend ("auto" resolved)
    backend: str
    emulate: bool
    emulate_reason: str
    enable_fsdp_float8_all_gather: bool
    #: run torchao's precompute_float8_dynamic_scale_for_fsdp after each optimizer step
    precompute_scale: bool
    #: why the float8 all-gather is on or off
    reason: str


def resolve_settings(config: Float8Config, parallel_dims: ParallelDims, job: RunContext) -> Float8Settings:
    emulate, emulate_reason = resolve_emulate(config.emulate, job.device)
    backend = job.backend  # resolved by the core (never "auto")
    all_gather, reason = resolve_all_gather(config.fsdp_float8_all_gather, config.recipe, backend, parallel_dims)
    return Float8Settings(config.recipe, backend, emulate, emulate_reason, all_gather, all_gather, reason)


_NEEDS = KernelNeeds(
    section="float8", kernels="float8", emulated_in="float32", min_capability=hardware.MIN_FLOAT8_CAPABILITY,
    hardware="a CUDA GPU with compute capability 8.9 or newer (SM89+: Ada, Hopper, Blackwell)",
    too_old="float8 training needs an NVIDIA GPU with compute capability 8.9 or newer (SM89+: Ada, Hopper, "
    "Blackwell); this GPU has compute capability {major}.{minor} (sm_{major}{minor}). Set --float8.emulate=true to "
    "emulate float8 matmuls in float32 (slow; for testing only), or remove float8 from model.converters.",
)


def resolve_emulate(emulate: bool | str, device: torch.device) -> tuple[bool, str]:
    """(emulate?, why). Raises TitanError when real kernels are asked for but cannot run."""
    return resolve_emulation(emulate, device, _NEEDS, hardware.cuda_capability)


GLOO_REASON = "gloo cannot all-gather float8 dtypes (RuntimeError: Invalid scalar type)"


def resolve_all_gather(
    requested: bool | str, recipe: str, backend: str, parallel_dims: ParallelDims
) -> tuple[bool, str]:
    """(all-gather weights in float8?, why)."""
    if requested is False:
        return False, "float8.fsdp_float8_all_gather=false"
    blockers: list[str] = []
    if recipe != "tensorwise":
        blockers.append(f"recipe {recipe}: torchao all-gathers float8 weights only with tensorwise scaling")
    if backend != "nccl":
        blockers.append(GLOO_REASON if backend == "gloo" else f"backend {backend} is not nccl")
    if requested is True and blockers:
        raise ConfigError(
            f"float8.fsdp_float8_all_gather=true cannot be honoured: {'; '.join(blockers)}. "
            f"Set --float8.fsdp_float8_all_gather=auto (or false)"
            + (", or use --float8.recipe=tensorwise" if recipe != "tensorwise" else "")
            + (", or run on CUDA with nccl" if backend != "nccl" else "")
            + "."
        )
    if not parallel_dims.fsdp_enabled:
        # Checked after the hard blockers so a wrong explicit request still fails loudly.
        return False, f"FSDP is not enabled (dp_shard={parallel_dims.dp_shard}): no weights are all-gathered"
    if blockers:
        return False, blockers[0]
    return True, f"nccl + FSDP (dp_shard={parallel_dims.dp_shard}) + tensorwise recipe"

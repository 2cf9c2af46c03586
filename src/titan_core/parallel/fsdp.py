"""FSDP2 / HSDP / replication of a model's blocks, then of its root, with the reshard policy."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..config.parallel_dims import ParallelDims
from ..config.sections import ParallelismSection
from ..plugin.resolved import resolve_param_dtype
from ..runtime.torch_compat import replicate_with_fsdp
from .expert_parallel import experts_modules, shard_experts

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def gather_dtype(parallelism: ParallelismSection, compute_dtype: torch.dtype) -> torch.dtype:
    """FSDP2's param_dtype: with bfloat16 compute, gathering float32 weights only to cast them
    in autocast doubles the all-gather traffic; the float32 shards stay the master weights and
    gradients are reduced in reduce_dtype (float32 by default), as torchtitan does."""
    return resolve_param_dtype(parallelism.param_dtype, compute_dtype)


def reshard_policy(policy: str, *, is_last_block: bool, pp_enabled: bool) -> bool:
    """FSDP2 ``reshard_after_forward`` for one block under ``parallelism.fsdp_reshard_after_forward``.

    ``default`` frees each block's gathered weights after its forward, except the
    last block's (backward starts there and would gather them straight back), and
    keeps them with pipelining, whose microbatches rerun every forward.
    """
    if policy == "always":
        return True
    if policy == "never":
        return False
    return not pp_enabled and not is_last_block


def apply_fsdp(
    model: nn.Module,
    blocks: Iterable[nn.Module],
    *,
    parallel_dims: ParallelDims,
    mesh: DeviceMesh | None,
    parallelism: ParallelismSection,
    compute_dtype: torch.dtype = torch.float32,
    expert_mesh: DeviceMesh | None = None,
) -> None:
    """Shard (or replicate) every block, then ``model`` itself, over the data-parallel ranks.

    The mesh is ``parallel_dims.dp_mesh(mesh)``: 2-D (dp_replicate x dp_shard) gives
    HSDP, 1-D dp_shard gives FSDP2. Without dp_shard the parameters are replicated
    (FSDP2's ``replicate``: whole parameters everywhere, gradients all-reduced), which
    composes with TP DTensors and pipeline schedules the way ``fully_shard`` does.
    With context parallelism the cp ranks join the shard dimension (``dp_shard_cp``): they hold the
    same weights and their gradients, from different tokens, must add up.
    A no-op when there is only one data-parallel (and context-parallel) rank. ``compute_dtype`` (the run's
    resolved training.dtype) is what ``parallelism.param_dtype=auto`` gathers in.
    ``expert_mesh`` (with EP): the mesh the EP-split experts modules are sharded over, each
    before its block (``expert_parallel.shard_experts``).
    """
    if parallel_dims.dp_cp <= 1:
        return
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    assert mesh is not None  # more than one data-parallel rank: a multi-process run, which has a mesh
    dp_mesh = parallel_dims.dp_mesh(mesh)
    mp = MixedPrecisionPolicy(param_dtype=gather_dtype(parallelism, compute_dtype),
                              reduce_dtype=_DTYPES[parallelism.reduce_dtype])
    blocks = list(blocks)
    if not parallel_dims.fsdp_enabled and not parallel_dims.cp_enabled:
        replicate = replicate_with_fsdp()
        for block in blocks:
            replicate(block, mesh=dp_mesh, mp_policy=mp)
        replicate(model, mesh=dp_mesh, mp_policy=mp)
        return
    policy = parallelism.fsdp_reshard_after_forward
    for i, block in enumerate(blocks):
        reshard = reshard_policy(policy, is_last_block=i == len(blocks) - 1, pp_enabled=parallel_dims.pp_enabled)
        if expert_mesh is not None:  # nested first: the block's FSDP2 then leaves the experts' weights alone
            for _, experts in experts_modules(block):
                shard_experts(experts, mesh=expert_mesh, mp_policy=mp, reshard_after_forward=reshard,
                              dp=parallel_dims.dp_cp)
        fully_shard(block, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard)
    # The root holds what no block holds (embeddings, final norm, head): gathered for
    # the whole step unless the policy says always.
    fully_shard(model, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=policy == "always")

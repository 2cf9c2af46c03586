"""A one-line account of how the model's parameters ended up placed, read from the model itself."""

from __future__ import annotations

from collections import Counter

from torch import nn


def describe_parameter_layout(model_parts: list[nn.Module]) -> str:
    """``"12 x dp_shard:Shard(0), tp:Shard(1); 4 x plain"``: how many parameters have each
    DTensor placement, so a log shows what the parallelize function really did rather than
    what the config asked for."""
    from torch.distributed.tensor import DTensor

    counts: Counter[str] = Counter()
    for part in model_parts:
        for param in part.parameters():
            if isinstance(param, DTensor):
                names = param.device_mesh.mesh_dim_names or tuple(str(i) for i in range(param.device_mesh.ndim))
                counts[", ".join(f"{name}:{placement}" for name, placement in zip(names, param.placements))] += 1
            else:
                counts["plain"] += 1
    return "; ".join(f"{n} x {placement}" for placement, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

"""Every private or version-dependent torch API titan-core and its plugins use, in one place.

torch keeps no promise about names that start with an underscore, so each one is reached here
and nowhere else (tests/test_torch_compat.py fails on a use outside this file). Each has either
a fallback or a refusal: a ``ConfigError`` (exit 2, no traceback) naming the torch that has it.
All of them exist, with the signatures used here, on torch 2.11.0 (the GPU image) through 2.13.0
(scripts/setup.sh); the floor itself is checked on import (``torch_floor``).

Behaviour that differs between those versions is made the same here too: ``trunc_normal_``
(torch 2.13 rejects and redraws, 2.11 inverts the CDF, so the same seed gave other weights).

Imports nothing of titan_core but ``errors`` and ``torch_floor``, so every layer may use it
(pyproject.toml's layers contract ignores imports of this module). Checkpoint internals are
imported on first use: importing this module costs no more than torch itself.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

import torch

from ..errors import ConfigError
from .torch_floor import TORCH_TESTED_UP_TO, floor_text

if TYPE_CHECKING:
    from torch.distributed.checkpoint.default_planner import (
        _EmptyStateDictLoadPlanner as EmptyStateDictLoadPlanner,
    )
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.planner import LoadPlanner
    from torch.distributed.checkpoint.storage import StorageReader
    from torch.distributed.device_mesh import DeviceMesh

__all__ = [
    "EmptyStateDictLoadPlanner",
    "attach_out_of_memory_observer",
    "compute_local_shape_and_global_offset",
    "cpu_flash_attention",
    "cpu_flash_attention_backward",
    "current_graph_task_id",
    "dtensor_has_single_dim_scaled_mm",
    "dispatch_mode_class",
    "dump_memory_snapshot",
    "fake_store_class",
    "flatten_mesh",
    "flatten_state_dict",
    "foreach_scaled_add_",
    "grouped_mm",
    "grouped_mm_op",
    "has_grouped_mm",
    "load_state_dict_in_process",
    "narrow_tensor_by_index",
    "pipeline_grad_divisor",
    "record_memory_history",
    "replicate_with_fsdp",
    "set_element",
    "storage_info",
    "streaming_load",
    "torch_function_subclass_disabled",
    "tree_map",
    "trunc_normal_",
    "unflatten_mesh",
    "unflatten_state_dict",
]


def _refuse(what: str) -> ConfigError:
    tested = ".".join(map(str, TORCH_TESTED_UP_TO))
    return ConfigError(
        f"titan-core needs {what}, which torch {torch.__version__} does not have (it is private to torch and "
        f"present in torch {floor_text()} to {tested}): install a torch in that range, e.g. "
        f"pip install 'torch>={floor_text()},<={tested}'")


def _private(module: str, name: str) -> Any:
    """``module.name``, or a ConfigError naming the torch versions it is known on."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        raise _refuse(f"{module}.{name}") from None


def _aten(name: str) -> Any:
    """The ATen operator ``torch.ops.aten.<name>``, or the refusal."""
    op = getattr(torch.ops.aten, name, None)
    if op is None:
        raise _refuse(f"torch.ops.aten.{name}")
    return op


# ---- tensor ops ------------------------------------------------------------------------------------


def has_grouped_mm() -> bool:
    """Whether this torch has the grouped GEMM (``torch._grouped_mm``); without it experts loop."""
    return hasattr(torch, "_grouped_mm")


def grouped_mm(x: torch.Tensor, weight: torch.Tensor, *, offs: torch.Tensor) -> torch.Tensor:
    """``torch._grouped_mm(x, weight, offs=offs)``: the rows of ``x`` up to ``offs[g]`` times ``weight[g]``.

    Called through the ``torch`` module so a tensor subclass's ``__torch_function__`` sees it
    under its own name (converters intercept it that way)."""
    out: torch.Tensor = torch._grouped_mm(x, weight, offs=offs)
    return out


def grouped_mm_op() -> Any:
    """The ATen overload packet of the grouped GEMM (for FLOP counters), or None without one."""
    return getattr(torch.ops.aten, "_grouped_mm", None)


def cpu_flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                        causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """ATen's CPU flash attention on [b, h, s, d] inputs: (out, logsumexp), no dropout."""
    op = _aten("_scaled_dot_product_flash_attention_for_cpu")
    out, lse = op(q, k, v, 0.0, causal)
    return out, lse


def cpu_flash_attention_backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 out: torch.Tensor, lse: torch.Tensor, *,
                                 causal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward of ``cpu_flash_attention``: (dq, dk, dv)."""
    op = _aten("_scaled_dot_product_flash_attention_for_cpu_backward")
    dq, dk, dv = op(grad, q, k, v, out, lse, 0.0, causal)
    return dq, dk, dv


def dtensor_has_single_dim_scaled_mm() -> bool:
    """Whether DTensor has the single-dim sharding strategy of ``_scaled_mm`` and pinned op handlers:
    torchao 0.18 asserts both before MXFP8 training (torch 2.13 has them, 2.11 does not)."""
    try:
        from torch.distributed.tensor import _dispatch, _ops
    except ImportError:
        return False
    return hasattr(_ops, "scaled_mm_single_dim_strategy") and hasattr(_dispatch, "is_pinned_handler")


def current_graph_task_id() -> int:
    """The id of the autograd graph task running now: -1 outside backward (so not in a recompute)."""
    task: int = torch._C._current_graph_task_id()
    return task


def torch_function_subclass_disabled() -> Any:
    """A context in which tensor subclasses' ``__torch_function__`` is off (the default handler's way)."""
    return torch._C.DisableTorchFunctionSubclass()


def tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    """``fn`` applied to every leaf of nested dicts, lists and tuples (torch's pytree)."""
    return _private("torch.utils._pytree", "tree_map")(fn, tree)


def trunc_normal_(tensor: torch.Tensor, *, mean: float, std: float, a: float, b: float,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """Fill ``tensor`` from N(mean, std) truncated to [a, b], the same numbers on every torch.

    torch 2.13's ``nn.init.trunc_normal_`` draws normals and redraws (a whole tensor's worth)
    those outside the bounds until none is; torch 2.11's inverts the CDF of uniforms. The same
    seed thus gave different weights and loss curves. For bounds that keep most of the mass (the
    only kind titan-core uses) this draws as 2.13 does on every torch; narrow bounds are torch's own.
    """
    if tensor.is_meta:
        return tensor
    kept = 0.5 * (math.erf((b - mean) / (std * math.sqrt(2))) - math.erf((a - mean) / (std * math.sqrt(2))))
    if kept <= 0.3:
        return torch.nn.init.trunc_normal_(tensor, mean=mean, std=std, a=a, b=b, generator=generator)
    with torch.no_grad():
        # The bounds as the tensor's dtype holds them, so the test below agrees with the stored values.
        low, high = tensor.new_tensor(a, device="cpu").item(), tensor.new_tensor(b, device="cpu").item()
        values = tensor.normal_(mean, std, generator=generator)
        while True:
            outside = (values < low) | (values > high)
            if not bool(outside.any()):
                break
            values = torch.where(outside, torch.empty_like(values).normal_(mean, std, generator=generator), values)
        if values is not tensor:
            tensor.copy_(values)
    return tensor


# ---- device meshes and data parallelism --------------------------------------------------------------


def foreach_scaled_add_(targets: list[torch.Tensor], keep: float, sources: list[torch.Tensor], take: float) -> None:
    """``target = target * keep + source * take`` for each pair, in place: two products and a sum, each
    rounded once (no fused multiply-add), with torch's multi-tensor kernels (``torch._foreach_*``, private)."""
    torch._foreach_mul_(targets, keep)
    torch._foreach_add_(targets, torch._foreach_mul(sources, take))


def pipeline_grad_divisor(schedule: object) -> int:
    """What a torch pipeline schedule's ``step`` divides every gradient of its stages by when it ends (its
    number of microbatches with ``scale_grads``, the default; 1 without). A schedule that does not say (not
    torch's) divides by nothing. ``_n_microbatches`` is private in torch 2.11-2.13."""
    if not getattr(schedule, "scale_grads", False):
        return 1
    divisor = getattr(schedule, "_n_microbatches", 1)
    return divisor if isinstance(divisor, int) and divisor > 0 else 1


def flatten_mesh(mesh: DeviceMesh, name: str) -> DeviceMesh:
    """The dims of ``mesh`` as one dim called ``name`` (``DeviceMesh._flatten``), registered on its root."""
    flattened: DeviceMesh = mesh._flatten(name)
    return flattened


def unflatten_mesh(mesh: DeviceMesh, dim: str, sizes: tuple[int, ...], names: tuple[str, ...]) -> DeviceMesh:
    """``mesh`` with dim ``dim`` split into dims ``names`` of ``sizes`` (``DeviceMesh._unflatten``, torch 2.10+)."""
    unflatten = getattr(mesh, "_unflatten", None)
    if unflatten is None:
        raise _refuse("DeviceMesh._unflatten (torch 2.10+)")
    split: DeviceMesh = unflatten(dim, sizes, names)
    return split


def replicate_with_fsdp() -> Callable[..., Any]:
    """torch's FSDP2-based ``replicate`` (parameters replicated, gradients all-reduced)."""
    replicate: Callable[..., Any] = _private("torch.distributed._composable.replicate_with_fsdp", "replicate")
    return replicate


def compute_local_shape_and_global_offset(global_shape: torch.Size, mesh: DeviceMesh,
                                          placements: Any) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(this rank's shard shape, its offset in the global tensor) of a DTensor layout, as DCP places
    shards; None on a torch without the helper (callers then read the whole tensor)."""
    try:
        fn = _private("torch.distributed.tensor._utils", "compute_local_shape_and_global_offset")
    except ConfigError:
        return None
    shape, offset = fn(global_shape, mesh, placements)
    return tuple(shape), tuple(offset)


def fake_store_class() -> type:
    """The key-value store of torch's fake process group; importing its module registers the ``fake``
    backend (one process playing one rank of a cluster layout: the memory plan, rehearsal)."""
    store: type = _private("torch.testing._internal.distributed.fake_pg", "FakeStore")
    return store


def dispatch_mode_class() -> type:
    """torch's ``TorchDispatchMode``: the base of a mode that sees every operator call (the memory plan's probe)."""
    mode: type = _private("torch.utils._python_dispatch", "TorchDispatchMode")
    return mode


# ---- checkpoints and serialization --------------------------------------------------------------------


def streaming_load(f: IO[bytes], *, weights_only: bool = True) -> object:
    """``torch.load`` of a stream written by torch's streaming saver (torchft's HTTP transport)."""
    load = _private("torch.distributed._serialization", "_streaming_load")
    return load(f, weights_only=weights_only)


def narrow_tensor_by_index(tensor: torch.Tensor, offsets: Any, sizes: Any) -> torch.Tensor:
    """The box of ``tensor`` at ``offsets`` with ``sizes`` (a view)."""
    narrowed: torch.Tensor = _private("torch.distributed._shard._utils", "narrow_tensor_by_index")(
        tensor, offsets, sizes)
    return narrowed


def flatten_state_dict(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """DCP's flattening of a nested state dict: (flat dict, the paths to rebuild it)."""
    flat, mappings = _private("torch.distributed.checkpoint._nested_dict", "flatten_state_dict")(state)
    return flat, mappings


def unflatten_state_dict(flat: dict[str, Any], mappings: dict[str, Any]) -> dict[str, Any]:
    """The nested state dict ``flatten_state_dict`` made ``flat`` from."""
    nested: dict[str, Any] = _private("torch.distributed.checkpoint._nested_dict", "unflatten_state_dict")(
        flat, mappings)
    return nested


def set_element(root: dict[str, Any], path: Any, value: Any) -> None:
    """Put ``value`` at ``path`` (a DCP object path) in the nested ``root``, creating containers."""
    _private("torch.distributed.checkpoint._traverse", "set_element")(root, path, value)


def storage_info(relative_path: str, offset: int, length: int) -> _StorageInfo:
    """Where one item lies in a DCP checkpoint: file, byte offset, byte length."""
    info: _StorageInfo = _private("torch.distributed.checkpoint.filesystem", "_StorageInfo")(
        relative_path, offset, length)
    return info


def load_state_dict_in_process(state: dict[str, Any], *, storage_reader: StorageReader,
                               planner: LoadPlanner) -> None:
    """DCP's load in this process alone, without reading ``state``'s entries as Stateful objects."""
    _private("torch.distributed.checkpoint.state_dict_loader", "_load_state_dict")(
        state, storage_reader=storage_reader, planner=planner, no_dist=True)


def __getattr__(name: str) -> Any:
    # Classes subclassed at import time, imported on first use (DCP is not needed to build a model).
    if name == "EmptyStateDictLoadPlanner":
        value = _private("torch.distributed.checkpoint.default_planner", "_EmptyStateDictLoadPlanner")
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---- CUDA memory history -----------------------------------------------------------------------------


def record_memory_history(max_entries: int | None) -> None:
    """Start (an int) or stop (None) the CUDA caching allocator's history for memory snapshots."""
    record = _private("torch.cuda.memory", "_record_memory_history")
    if max_entries is None:
        record(enabled=None)
    else:
        record(max_entries=max_entries)


def dump_memory_snapshot(path: str) -> None:
    """Write the allocator's history as a pickle for pytorch.org/memory_viz."""
    _private("torch.cuda.memory", "_dump_snapshot")(path)


def attach_out_of_memory_observer(observer: Callable[[int, int, int, int], None]) -> None:
    """Call ``observer(device, alloc, device_alloc, device_free)`` when CUDA runs out of memory."""
    _private("torch._C", "_cuda_attach_out_of_memory_observer")(observer)

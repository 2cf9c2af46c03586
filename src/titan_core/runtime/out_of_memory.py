"""Running out of memory: one message with the figures and the settings that lower it.

The memory check before training (:mod:`.memory_estimate`) counts weights, gradients and
optimizer state only; activations grow with the batch and the sequence and can still
exhaust memory in the first step. torch reports that as ``torch.OutOfMemoryError`` on a
GPU and as a ``RuntimeError`` ("DefaultCPUAllocator: can't allocate memory") on CPU,
wherever the allocation happened, often inside a plugin's forward. Either way it is the
run's shape, not a bug in the plugin, so the message says which settings to lower.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from ..errors import OutOfMemory, PluginOutOfMemory

__all__ = ["is_out_of_memory", "out_of_memory_error", "out_of_memory_named"]

_MARKERS = ("can't allocate memory", "out of memory", "cannot allocate memory")


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen and len(seen) < 16:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def is_out_of_memory(exc: BaseException) -> bool:
    """True when ``exc`` (or what it was raised from) is a failed allocation."""
    import torch

    for e in _chain(exc):
        if isinstance(e, (torch.OutOfMemoryError, MemoryError)):
            return True
        if isinstance(e, RuntimeError) and any(m in str(e).lower() for m in _MARKERS):
            return True
    return False


def _requested(exc: BaseException) -> str:
    """'512.0 MiB' from torch's CPU or CUDA text, or '' when it names no size."""
    for e in _chain(exc):
        text = str(e)
        found = re.search(r"allocate (\d+) bytes", text)
        if found:
            return f"{int(found.group(1)) / 2**20:,.1f} MiB"
        found = re.search(r"allocate (\d+(?:\.\d+)? [KMGT]iB)", text)
        if found:
            return found.group(1)
    return ""


def out_of_memory_error(exc: BaseException, *, where: str, kind: type[OutOfMemory] = OutOfMemory) -> OutOfMemory:
    """The message for an allocation that failed ``where`` (e.g. "in step 1", "while setting up the run")."""
    size = _requested(exc)
    asked = f": an allocation of {size} failed" if size else ""
    # In a step it is the activations: the check before training already counted everything else.
    why = (" The weights, gradients and optimizer state were checked to fit before training; the activations "
           "of one micro-batch did not." if where.startswith("in step") else "")
    return kind(
        f"out of memory {where}{asked}.{why} Lower --training.local_batch_size (keep the optimizer's batch with "
        "--training.global_batch_size, which accumulates gradients), or --training.seq_len, turn on "
        "--activation_checkpoint.mode=full, or spread the model over more ranks (--parallelism.dp_shard, "
        "--parallelism.tp).",
        where=where, original=exc,
    )


@contextlib.contextmanager
def out_of_memory_named(where: str) -> Iterator[None]:
    """A failed allocation in the block as one OutOfMemory message saying ``where``; one already named
    inside a plugin's method (see plugin_calls) keeps that method and gains ``where`` in front."""
    try:
        yield
    except PluginOutOfMemory as exc:
        raise out_of_memory_error(exc.original, where=f"{where}, {exc.where}") from exc.original
    except (RuntimeError, MemoryError) as exc:
        if is_out_of_memory(exc):
            raise out_of_memory_error(exc, where=where) from exc
        raise

"""One rank of a cluster layout in this process: torch's fake process group.

The fake backend answers every collective at once without sending anything, so a single
process can build (and even step) the rank a layout of hundreds of ranks would give it:
meshes, FSDP2 and TP shards, pipeline stages. The values that cross ranks are garbage by
design; shapes, memory and code paths are the real ones. Used by the dry run's memory plan
(``train/memory_plan.py``) and by rehearsal mode; ``pipeline.py`` asks ``is_fake_group`` to give
its stages their shapes (no neighbour can tell them).

torch keeps the fake backend under ``torch.testing._internal`` (a private module), reached through
``runtime/torch_compat.py`` like every private torch name; this is the one file that uses it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch.distributed as dist

from ..errors import ConfigError
from ..runtime.torch_compat import fake_store_class


def _register_fake_backend() -> type:
    """Import the module that registers the ``fake`` backend; return its key-value store class."""
    try:
        return fake_store_class()
    except ConfigError as exc:
        raise ConfigError(f"planning or rehearsing a cluster layout needs torch's fake process group: {exc}") from None


@contextlib.contextmanager
def fake_process_group(*, rank: int, world_size: int) -> Iterator[None]:
    """The default process group, for the duration of the block, is rank ``rank`` of ``world_size`` fake ranks.

    Refuses to replace a real group: a process already in a job must not pretend to be another rank.
    """
    if dist.is_initialized():
        raise RuntimeError("a process group already exists; a fake one would replace it")
    store = _register_fake_backend()()
    dist.init_process_group(backend="fake", rank=rank, world_size=world_size, store=store)
    try:
        yield
    finally:
        if dist.is_initialized():  # the run may have ended the group itself
            dist.destroy_process_group()


def is_fake_group() -> bool:
    """Whether the default group is a fake one (rehearsal: collective values are not real)."""
    return dist.is_initialized() and str(dist.get_backend()).lower() == "fake"

"""Refuse, before the first step, data on which document masking leaves nothing to learn.

With ``data.document_masking`` the label of every end-of-document token is ignored
(``documents.py``). Data made only of such tokens (a shard set of EOS tokens, documents
that tokenize to nothing) then has no token with a target: every step's loss is 0 and
nothing is trained, without a word. Each source of the run (every mixture source, both
splits) is scanned in storage order until the first window with a target, so ordinary
data costs one read of a few windows; only data that is refused is read whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..errors import ConfigError
from .documents import document_ends
from .loader import TokenDataLoader
from .mixture import MixtureDataLoader

# Tokens read per scan chunk (8 MB of int64): a few windows even at long sequence lengths.
_CHUNK_TOKENS = 1 << 20

ReadRows = Callable[[torch.Tensor], torch.Tensor]


def _sources(loader: Any, source: str, mix: dict[str, str]) -> Iterator[tuple[str, ReadRows, int, int]]:
    """(the data's setting and value, a reader of windows by row, its windows, its window length) of the core's
    loaders; nothing for a spec's own loader (its batches are its business)."""
    if isinstance(loader, TokenDataLoader):
        yield f'data.source "{source}"', loader.read_rows, loader.num_windows, loader.seq_len + 1
    elif isinstance(loader, MixtureDataLoader):
        for name, windows in zip(loader.names, loader.windows):
            yield f'data.mix.{name}.source "{mix.get(name, name)}"', windows.read, windows.num_windows, windows.window


def has_a_target(read: ReadRows, num_windows: int, window: int, *, eos_id: int, bos_id: int) -> bool:
    """Whether any window keeps a label once document ends are masked (stops at the first that does)."""
    step = max(1, _CHUNK_TOKENS // window)
    for start in range(0, num_windows, step):
        batch = read(torch.arange(start, min(start + step, num_windows)))
        inputs, labels = batch[:, :-1], batch[:, 1:]
        if not bool(document_ends(inputs, labels, eos_id=eos_id, bos_id=bos_id).all()):
            return True
    return False


def check_targets_under_masking(loader: Any, *, split: str, source: str, mix: dict[str, str], eos_id: int,
                                bos_id: int) -> None:
    """ConfigError naming the data and the setting when masking leaves some source of ``loader`` no target."""
    for what, read, num_windows, window in _sources(loader, source, mix):
        if not has_a_target(read, num_windows, window, eos_id=eos_id, bos_id=bos_id):
            raise ConfigError(
                f"data.document_masking=true leaves no token with a target in {what} ({split} split): every token "
                f"of its {num_windows} windows is an end-of-document token (EOS id {eos_id}), whose label masking "
                "ignores, so the loss would be 0 and nothing would be learned. Give data that holds text (re-run "
                "titan-data prepare on the real inputs), or set --data.document_masking=false."
            )


__all__ = ["check_targets_under_masking", "has_a_target"]

"""``build_dataloader`` (the core's default ``build_dataloader_fn``) and ``build_mixture_loader``
(``data.mix``): a source's split, checked, as a loader of sharded, stateful batches."""

from __future__ import annotations

import logging
from typing import Literal

import torch

from ..config.sections import DataSection
from ..errors import ConfigError
from ..plugin.protocols import Tokenizer
from .loader import TokenDataLoader, WindowSource
from .mixture import MixtureDataLoader
from .packing import check_split, split_stream, tokenized_source
from .shards import TOKENS_PREFIX, open_shard_set, split_windows

logger = logging.getLogger(__package__)  # "titan_core.data", as before the loaders had their own module

# The config's default (data.val_fraction), so a loader built without a config splits as a run does.
DEFAULT_VAL_FRACTION: float = DataSection.model_fields["val_fraction"].default


def build_dataloader(
    *,
    source: str,
    tokenizer: Tokenizer,
    seq_len: int,
    local_batch_size: int,
    dp_rank: int = 0,
    dp_world_size: int = 1,
    seed: int = 0,
    split: Literal["train", "validation"] = "train",
    val_fraction: float = DEFAULT_VAL_FRACTION,
    text_field: str = "text",
    hf_split: str = "train",
    allow_download: bool = False,
) -> TokenDataLoader:
    """A loader over one split of ``source``; rank ``dp_rank`` of ``dp_world_size`` gets its rows.

    The train split is shuffled per epoch with ``seed``; the validation split is
    sequential. Raises ConfigError for unreadable sources and for a split smaller
    than one global batch.
    """
    stream, num_docs = _split_of(source, tokenizer, split=split, val_fraction=val_fraction, text_field=text_field,
                                 hf_split=hf_split, allow_download=allow_download)
    global_batch = local_batch_size * dp_world_size
    check_split(stream, split=split, source=source, num_docs=num_docs, val_fraction=val_fraction,
                window=seq_len + 1, global_batch=global_batch)
    loader = TokenDataLoader(
        stream,
        seq_len=seq_len,
        local_batch_size=local_batch_size,
        dp_rank=dp_rank,
        dp_world_size=dp_world_size,
        seed=seed,
        shuffle=split == "train",
        name=split,
    )
    loader.source = source
    logger.info("data %s (%s): %d documents, %r", source, split, num_docs, loader)
    return loader


def _split_of(source: str, tokenizer: Tokenizer, *, split: str, val_fraction: float, text_field: str, hf_split: str,
              allow_download: bool) -> tuple[torch.Tensor | WindowSource, int]:
    """One split of ``source`` as a token stream (or, for shards, a window reader) and its document count."""
    if split not in ("train", "validation"):
        raise ConfigError(f'data split "{split}" is unknown; use "train" or "validation".')
    if source.startswith(TOKENS_PREFIX):  # pre-tokenized shards, memory-mapped: nothing is tokenized here
        view = split_windows(open_shard_set(source[len(TOKENS_PREFIX):], tokenizer), split=split,
                             val_fraction=val_fraction)
        return view, view.num_docs
    packed = tokenized_source(source, tokenizer, text_field=text_field, hf_split=hf_split, allow_download=allow_download)
    return split_stream(packed, split=split, val_fraction=val_fraction)


def build_mixture_loader(
    *,
    mix: dict[str, tuple[str, float]],
    tokenizer: Tokenizer,
    seq_len: int,
    local_batch_size: int,
    dp_rank: int = 0,
    dp_world_size: int = 1,
    seed: int = 0,
    split: Literal["train", "validation"] = "train",
    val_fraction: float = DEFAULT_VAL_FRACTION,
    text_field: str = "text",
    hf_split: str = "train",
    allow_download: bool = False,
) -> MixtureDataLoader:
    """A loader whose rows come from the sources of ``mix`` (name -> (source, weight)) in proportion to the weights."""
    parts: list[tuple[str, float, torch.Tensor | WindowSource]] = []
    for name, (source, weight) in mix.items():
        try:
            stream, num_docs = _split_of(source, tokenizer, split=split, val_fraction=val_fraction,
                                         text_field=text_field, hf_split=hf_split, allow_download=allow_download)
            check_split(stream, split=split, source=source, num_docs=num_docs, val_fraction=val_fraction,
                        window=seq_len + 1, global_batch=1)
        except ConfigError as exc:  # the readers name data.source; here the setting is the mixture's own
            raise ConfigError(str(exc).replace("data.source", f"data.mix.{name}.source")) from None
        parts.append((name, weight, stream))
    loader = MixtureDataLoader(parts, seq_len=seq_len, local_batch_size=local_batch_size, dp_rank=dp_rank,
                               dp_world_size=dp_world_size, seed=seed, shuffle=split == "train", name=split)
    loader.sources = [source for source, _ in mix.values()]
    logger.info("data mixture (%s): %r", split, loader)
    return loader

"""Data loading: documents -> packed token stream -> sharded, stateful batches.

``build_dataloader`` (in ``dataloaders``) is the core's default ``build_dataloader_fn``. Modules:
``corpus`` (the built-in corpus), ``sources`` (files and hub), ``packing`` (tokenize, split,
cache) and ``loader`` (windows, order, DP sharding, state); ``shards`` (``tokens:DIR``,
memory-mapped), ``permutation`` (its window order), ``prepare/`` and ``doc_stream``
(``titan-data prepare``, which writes the format ``shards`` reads), ``mixture`` (``data.mix``)
and ``prefetch`` (the background thread). docs/data.md.

The names below are loaded on first use, so ``titan-data prepare`` (``data.prepare``) starts
without torch, which the loaders need.

May import ``optim``, ``moe``, ``plugin``, ``models``, ``config``, ``runtime`` and the leaves;
independent of ``checkpoint``, ``observability`` and ``parallel``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["MixtureDataLoader", "TokenDataLoader", "build_dataloader", "build_mixture_loader"]

_HOME = {"MixtureDataLoader": "mixture", "TokenDataLoader": "loader", "build_dataloader": "dataloaders",
         "build_mixture_loader": "dataloaders"}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from .dataloaders import build_dataloader as build_dataloader, build_mixture_loader as build_mixture_loader
    from .loader import TokenDataLoader as TokenDataLoader
    from .mixture import MixtureDataLoader as MixtureDataLoader

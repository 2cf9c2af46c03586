"""``titan-data prepare``: text sources -> the token shards ``data/shards.py`` reads (docs/data.md).

``pipeline`` (the run: checks, inputs, resume), ``tasks`` (the sources cut into pieces that do
not depend on the number of workers), ``workers`` (the tokenizer processes, each writing its own
piece files), ``writer`` (pieces -> shards, progress records), ``checks`` (what is refused
before anything is written), ``provenance`` (duplicate files; inputs hashed before and after they
are read) and ``repeats`` (documents that repeat an earlier one, counted). No module here imports torch.
"""

from __future__ import annotations

from .pipeline import PrepareRequest, prepare

__all__ = ["PrepareRequest", "prepare"]

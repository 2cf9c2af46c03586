"""Token ids the model cannot embed are the tokenizer's fault, and are said to be before the model sees them.

``check_vocab`` (config/derived.py) compares the tokenizer's declared ``vocab_size`` with the
model's before anything is built. A tokenizer can still give ids beyond what it declares (a
``tokenizer.json`` whose ids are not dense, a plugin's own tokenizer); the embedding then
failed with an IndexError inside the model's forward, reported as a bug of the model plugin.
The packed token stream is checked against the tokenizer's own ``vocab_size`` once, when the
data is tokenized, and every batch against the model's vocabulary before the forward.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..plugin.spec_factories import Tokenizer

__all__ = ["check_batch_ids", "check_tokenizer_ids"]


def _name(tokenizer: object) -> str:
    return str(getattr(tokenizer, "name", type(tokenizer).__name__))


def _outside(ids: torch.Tensor, vocab: int) -> int | None:
    """An id of ``ids`` outside 0..vocab-1 (the lowest if negative, else the highest), or None."""
    low, high = int(ids.min()), int(ids.max())
    return low if low < 0 else high if high >= vocab else None


def check_tokenizer_ids(tokens: torch.Tensor, tokenizer: Tokenizer) -> None:
    """Every id the tokenizer produced lies in 0..vocab_size-1 of the tokenizer itself."""
    if tokens.numel() == 0:
        return
    vocab = int(tokenizer.vocab_size)
    bad = _outside(tokens, vocab)
    if bad is not None:
        raise ConfigError(
            f"the tokenizer ({_name(tokenizer)}, data.tokenizer) produced token id {bad}, outside its own "
            f"vocabulary of {vocab} ids (0..{vocab - 1}): the tokenizer is inconsistent (its ids are not dense, or "
            f"its vocab_size is wrong), so the model would have no embedding for that token. Fix or replace the "
            f"tokenizer (--data.tokenizer)."
        )


def check_batch_ids(inputs: torch.Tensor, model_args: object, tokenizer: Tokenizer) -> None:
    """Every id of a batch has an embedding row in the model (when its args declare ``vocab_size``)."""
    vocab = getattr(model_args, "vocab_size", None)
    if not isinstance(vocab, int) or inputs.numel() == 0 or inputs.is_floating_point():
        return
    bad = _outside(inputs, vocab)
    if bad is not None:
        raise ConfigError(
            f"a batch holds token id {bad}, but the model's vocabulary has {vocab} ids (0..{vocab - 1}); the "
            f"tokenizer ({_name(tokenizer)}, data.tokenizer) or the data loader gives ids the model has no "
            f"embedding for. Use the tokenizer the model was made for (--data.tokenizer), or a model whose "
            f"vocab_size covers the tokenizer's ids."
        )

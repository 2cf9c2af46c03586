"""Token sampling from a whole model on one process: greedy by default, else temperature and top-k.

With a model whose forward takes a ``cache`` keyword (the contract in ``kv_cache.py``) the
prompt is read once and every later step feeds one token; any other model is given the
whole prefix at every step, which gives the same tokens, only slower.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import NonFiniteError
from .kv_cache import KVCache


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0: greedy (the most likely token, no randomness)
    top_k: int | None = None  # sample only among the k most likely tokens
    seed: int = 0


def takes_cache(model: nn.Module) -> bool:
    """Whether ``model.forward`` accepts the ``cache`` keyword of the KV-cache contract."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
    return "cache" in params


def _pick(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator) -> int:
    """The next token from the last position's logits ``[vocab]``.

    The logits are shifted so that the largest is 0 before they are divided by the temperature, and the
    temperature is at least float32's smallest normal number: a temperature such as 1e-40 makes every other
    logit -inf (the most likely token, as greedy), never inf or NaN probabilities.
    """
    if not bool(torch.isfinite(logits).all()):
        raise NonFiniteError("the model's output (logits) holds NaN or inf, so no token can be chosen: the "
                             "checkpoint's weights are not finite or overflow; generate from an earlier checkpoint.")
    if sampling.temperature == 0.0:
        return int(torch.argmax(logits))
    shifted = logits.float() - logits.float().max()
    scaled = shifted / max(sampling.temperature, torch.finfo(torch.float32).tiny)
    if sampling.top_k is not None and sampling.top_k < scaled.numel():
        kth = torch.topk(scaled, sampling.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))


@torch.no_grad()
def sample(model: nn.Module, prompt: Sequence[int], sampling: Sampling, *, eos_id: int | None = None,
           use_cache: bool = True, stop: Callable[[list[int]], bool] | None = None) -> list[int]:
    """The new tokens after ``prompt`` (at most ``max_new_tokens``; stops after ``eos_id``, or as soon as
    ``stop(new tokens so far)`` is true: a stop string reached, say).

    The caller keeps ``len(prompt) + max_new_tokens`` within the model's positions.
    """
    model.eval()
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(sampling.seed)
    ids = torch.tensor([list(prompt)], dtype=torch.long, device=device)
    cache = KVCache(len(prompt) + sampling.max_new_tokens) if use_cache else None
    new: list[int] = []
    feed = ids
    while len(new) < sampling.max_new_tokens:
        if cache is not None:
            logits = model(feed, cache=cache)
            cache.advance(feed.shape[1])
        else:
            logits = model(ids)
        token = _pick(logits[0, -1], sampling, generator)
        new.append(token)
        if token == eos_id or (stop is not None and stop(new)):
            break
        feed = torch.tensor([[token]], dtype=torch.long, device=device)
        ids = torch.cat([ids, feed], dim=1)
    return new

"""The key/value cache ``titan-generate`` hands a model's forward (optional for plugins).

The contract, for a model that wants fast sampling:

* ``forward(tokens, *, cache=None)``: with ``cache=None`` nothing changes (training never
  passes one). With a cache, ``tokens`` are the *new* tokens only; their positions start at
  ``cache.offset`` (the tokens already cached), so rotary tables and causal masks are read
  from there.
* each attention layer calls ``cache.layer(name).append(k, v)`` with its keys and values for
  the new tokens, laid out ``[batch, new_tokens, ...]``, and attends to what it returns: every
  cached position followed by the new ones (a view of a buffer sized once, no copy per token).
* the model does not move the offset: the caller calls ``cache.advance(n)`` after each forward,
  so one forward may call ``append`` for as many layers as it has.

A model whose forward takes no ``cache`` keyword still samples: the generator then feeds
the whole prefix for every new token (quadratic, and it says so).
"""

from __future__ import annotations

import torch


class LayerCache:
    """One attention layer's keys and values, in buffers of the cache's full length."""

    def __init__(self, owner: KVCache) -> None:
        self._owner = owner
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new tokens' ``k``/``v`` (``[batch, new, ...]``) at the cache's offset and return
        the keys and values of every position so far (``[batch, offset + new, ...]``)."""
        start, new = self._owner.offset, k.shape[1]
        end = start + new
        if end > self._owner.max_len:
            raise ValueError(f"KVCache: {end} positions do not fit its max_len {self._owner.max_len}")
        if self._k is None or self._v is None:
            self._k = k.new_empty((k.shape[0], self._owner.max_len, *k.shape[2:]))
            self._v = v.new_empty((v.shape[0], self._owner.max_len, *v.shape[2:]))
        self._k[:, start:end] = k
        self._v[:, start:end] = v
        return self._k[:, :end], self._v[:, :end]


class KVCache:
    """Keys and values of every layer for up to ``max_len`` positions (see the module docstring)."""

    def __init__(self, max_len: int) -> None:
        if max_len <= 0:
            raise ValueError(f"KVCache: max_len must be positive, got {max_len}")
        self.max_len = max_len
        self.offset = 0  # positions already cached: the first new token's position
        self._layers: dict[str, LayerCache] = {}

    def layer(self, name: str) -> LayerCache:
        """The cache of the layer called ``name`` (created on first use)."""
        if name not in self._layers:
            self._layers[name] = LayerCache(self)
        return self._layers[name]

    def advance(self, new_tokens: int) -> None:
        """Called by the generator after each forward: the new tokens are now cached."""
        self.offset += new_tokens

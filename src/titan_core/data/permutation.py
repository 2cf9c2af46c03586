"""Window orders that cost no memory: a seeded bijection of ``[0, n)`` computed per index.

``torch.randperm(n)`` holds ``8 n`` bytes; for a shard set of billions of tokens that
grows with the corpus (62 MB for 2B tokens in windows of 257). For ``tokens:`` sources the
order is a 4-round Feistel network over the smallest even power of two >= n, keyed by
(seed, epoch), with cycle walking (a value >= n is encrypted again) so it maps ``[0, n)``
onto itself. Integer arithmetic only: the same order on every machine, rank and run.
"""

from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1
_ROUNDS = 4


def _mix(x: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit hash of ``x``."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


class LazyOrder:
    """Position -> window for one epoch; identity when not shuffled. Indexable by int or slice."""

    def __init__(self, n: int, *, seed: int, epoch: int, shuffle: bool) -> None:
        self.n = n
        self.shuffle = shuffle
        self.half = max(1, ((max(n, 2) - 1).bit_length() + 1) // 2)
        self.mask = (1 << self.half) - 1
        self.keys = [_mix((_mix(seed & _MASK64) ^ epoch) + r) for r in range(_ROUNDS)]

    def _encrypt(self, x: int) -> int:
        left, right = x >> self.half, x & self.mask
        for key in self.keys:
            left, right = right, left ^ (_mix(key ^ right) & self.mask)
        return (left << self.half) | right

    def at(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(i)
        if not self.shuffle:
            return i
        y = self._encrypt(i)
        while y >= self.n:  # cycle walking: at most 4x the domain, about 2 steps on average
            y = self._encrypt(y)
        return y

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int | slice) -> torch.Tensor:
        if isinstance(index, slice):
            return torch.tensor([self.at(i) for i in range(*index.indices(self.n))], dtype=torch.int64)
        return torch.tensor(self.at(index), dtype=torch.int64)

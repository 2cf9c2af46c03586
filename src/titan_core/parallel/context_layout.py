"""Which tokens of a sequence each context-parallel rank holds.

With ``cp`` ranks the sequence (length S) is cut into chunks. Causal attention makes a late
query see many more keys than an early one, so a rank holding a contiguous quarter of the
sequence would do very uneven work (the last quarter's queries see 7x the keys of the first
quarter's, about 1.75 max/mean at cp 4). With load balancing the sequence is cut into ``2 cp``
chunks and rank r holds chunk r and its mirror ``2 cp - 1 - r``: an early chunk and a late one,
so every rank computes the same number of query-key pairs (torchtitan and Megatron-Core use the
same "head and tail" split). Without it rank r holds chunk r of ``cp``.

A rank's local sequence is its chunks back to back; ``global_index`` says where each local token
sits in the whole sequence, which is what causality and rotary positions are computed from.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ContextLayout:
    """The chunks of a length-``seq_len`` sequence held by ``rank`` of ``cp`` ranks."""

    cp: int
    rank: int
    seq_len: int
    load_balance: bool = True

    def __post_init__(self) -> None:
        if self.seq_len % self.chunk_count:
            raise ValueError(f"context parallelism: seq_len {self.seq_len} is not divisible into {self.chunk_count} "
                             f"equal chunks (cp={self.cp}{', load-balanced' if self.load_balance else ''})")

    @property
    def chunk_count(self) -> int:
        return 2 * self.cp if self.load_balance else self.cp

    @property
    def chunk_len(self) -> int:
        return self.seq_len // self.chunk_count

    @property
    def local_len(self) -> int:
        return self.seq_len // self.cp

    def chunks_of(self, rank: int) -> tuple[int, ...]:
        """The global chunk ids ``rank`` holds, in its local order."""
        if self.load_balance:
            return (rank, 2 * self.cp - 1 - rank)
        return (rank,)

    @property
    def local_chunks(self) -> tuple[int, ...]:
        return self.chunks_of(self.rank)

    def gathered_chunks(self) -> tuple[int, ...]:
        """The global chunk id of each chunk of an all-gather over the cp ranks (rank-major)."""
        return tuple(c for r in range(self.cp) for c in self.chunks_of(r))

    def global_index(self, device: torch.device | None = None) -> torch.Tensor:
        """int64 [local_len]: each local token's index in the whole sequence."""
        return torch.cat([torch.arange(c * self.chunk_len, (c + 1) * self.chunk_len, device=device)
                          for c in self.local_chunks])

    def shard(self, t: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's tokens of ``t`` (the whole sequence along ``dim``), contiguous."""
        if t.shape[dim] != self.seq_len:
            raise ValueError(f"context parallelism: a tensor of {t.shape[dim]} tokens along dim {dim}, but the "
                             f"layout is for sequences of {self.seq_len}")
        n = self.chunk_len
        return torch.cat([t.narrow(dim, c * n, n) for c in self.local_chunks], dim=dim).contiguous()


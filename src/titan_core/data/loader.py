"""The stateful, data-parallel token loader over a packed stream.

Windows: the split's stream is cut into ``N = len(stream) // (seq_len + 1)``
non-overlapping windows of ``seq_len + 1`` tokens (the tail is dropped); a
window ``w`` gives ``inputs = w[:-1]`` and ``labels = w[1:]``.

Order: the train split visits the windows in a fresh seeded permutation every
epoch (``torch.randperm`` seeded from ``(seed, epoch)``), so the order is the same
on every run and every rank; the validation split is sequential. When fewer
than one global batch of windows is left, the next epoch starts, so a run may
take more steps than one pass over the data holds.

Data parallelism with exact parity: every rank builds the same global batch of
``local_batch_size * dp_world_size`` windows and keeps rows
``[dp_rank * local_batch_size, (dp_rank + 1) * local_batch_size)``. Two ranks with
local batch 2 therefore see exactly the rows of one process with local batch 4,
and the state is a global position (epoch, windows consumed in the epoch), so a
checkpoint saved with 2 ranks resumes with 1 (or any other layout with the same
data settings). The cost: each rank tokenizes and holds the whole split (under a
second and a few MB for the built-in corpus).
"""

from __future__ import annotations

from typing import Any, Protocol, TypedDict, Unpack, runtime_checkable

import torch

from ..errors import ConfigError
from .identity import stream_fingerprint
from .permutation import LazyOrder

# Mixes (seed, epoch) into one generator seed; any fixed odd constant would do.
_EPOCH_MIX = 0x9E3779B97F4A7C15
_MASK = (1 << 63) - 1


@runtime_checkable
class WindowSource(Protocol):
    """A split too large to hold in memory (``tokens:DIR``): it reads the windows it is asked for."""

    def numel(self) -> int: ...

    def read_windows(self, rows: torch.Tensor, window: int) -> torch.Tensor: ...


class RankLayout(TypedDict, total=False):
    """The optional keywords every loader passes through to :class:`RankBatches`, whose signature holds
    their defaults (rank 0 of 1, seed 0, shuffled, named "train"): declared once, not per loader."""

    dp_rank: int
    dp_world_size: int
    seed: int
    shuffle: bool
    name: str


class RankBatches:
    """What a data-parallel loader of either kind is told: its rows' shape, its rank's share of each global
    batch, and its order's seed. Checks the rank."""

    def __init__(self, *, seq_len: int, local_batch_size: int, dp_rank: int = 0, dp_world_size: int = 1,
                 seed: int = 0, shuffle: bool = True, name: str = "train") -> None:
        if not 0 <= dp_rank < dp_world_size:
            raise ValueError(f"dp_rank {dp_rank} is outside 0..{dp_world_size - 1}")
        self.seq_len = seq_len
        self.local_batch_size = local_batch_size
        self.dp_rank = dp_rank
        self.dp_world_size = dp_world_size
        self.global_batch_size = local_batch_size * dp_world_size
        self.seed = seed
        self.shuffle = shuffle
        self.name = name

    @property
    def tokens_per_batch(self) -> int:
        """Input tokens this rank gets per batch (``local_batch_size * seq_len``)."""
        return self.local_batch_size * self.seq_len

    @property
    def global_tokens_per_batch(self) -> int:
        return self.global_batch_size * self.seq_len


def epoch_order(num_windows: int, seed: int, epoch: int) -> torch.Tensor:
    """The seeded permutation of ``num_windows`` windows for ``epoch`` (the same on every rank)."""
    gen = torch.Generator().manual_seed((seed * _EPOCH_MIX + epoch) & _MASK)
    return torch.randperm(num_windows, generator=gen)


class TokenDataLoader(RankBatches):
    """Yields ``(inputs, labels)`` int64 tensors of shape ``[local_batch_size, seq_len]`` forever.

    It is its own iterator: ``next(loader)`` continues from the current state.
    ``state_dict()`` holds plain ints only (saved with torch.distributed.checkpoint).
    """

    def __init__(
        self,
        stream: torch.Tensor | WindowSource,
        *,
        seq_len: int,
        local_batch_size: int,
        **layout: Unpack[RankLayout],
    ) -> None:
        super().__init__(seq_len=seq_len, local_batch_size=local_batch_size, **layout)
        self.num_tokens = int(stream.numel())
        self.num_windows = self.num_tokens // (seq_len + 1)
        if self.num_windows < self.global_batch_size:
            raise ValueError(f"{self.name}: {self.num_windows} windows cannot fill a global batch of {self.global_batch_size}")
        self._source = stream if isinstance(stream, WindowSource) else None
        self._stream = stream
        self._fingerprint: str | None = None
        self.source = ""  # the data.source it was built from (build_dataloader sets it), for the checkpoint's record
        if not isinstance(stream, WindowSource):
            self._windows = stream[: self.num_windows * (seq_len + 1)].view(self.num_windows, seq_len + 1)
        self.epoch = 0
        self.window_offset = 0  # global windows consumed in this epoch
        self._order_epoch = -1
        self._order: torch.Tensor | LazyOrder = torch.arange(self.num_windows) if self._source is None else \
            LazyOrder(self.num_windows, seed=self.seed, epoch=0, shuffle=False)

    def fingerprint(self) -> str:
        """A digest of the split's tokens (data/identity.py), computed once."""
        if self._fingerprint is None:
            self._fingerprint = stream_fingerprint(self._stream)
        return self._fingerprint

    def data_record(self) -> dict[str, dict[str, Any]]:
        """What a checkpoint records of this loader's data (data/identity.py)."""
        return {"data.source": {"source": self.source, "weight": 1.0, "fingerprint": self.fingerprint()}}

    @property
    def batches_per_epoch(self) -> int:
        return self.num_windows // self.global_batch_size

    def _epoch_order(self) -> torch.Tensor | LazyOrder:
        if self._order_epoch != self.epoch:
            if self.shuffle and self._source is not None:  # shards: an order that holds no memory
                self._order = LazyOrder(self.num_windows, seed=self.seed, epoch=self.epoch, shuffle=True)
            elif self.shuffle:
                self._order = epoch_order(self.num_windows, self.seed, self.epoch)
            self._order_epoch = self.epoch
        return self._order

    def __iter__(self) -> TokenDataLoader:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.window_offset + self.global_batch_size > self.num_windows:
            self.epoch += 1
            self.window_offset = 0
        start = self.window_offset + self.dp_rank * self.local_batch_size
        rows = self._epoch_order()[start : start + self.local_batch_size]
        self.window_offset += self.global_batch_size
        batch = self.read_rows(rows)
        return batch[:, :-1].contiguous(), batch[:, 1:].contiguous()

    def read_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """Windows ``rows`` (in storage order) as int64 ``[len(rows), seq_len + 1]``."""
        if self._source is not None:  # only the windows asked for are read
            return self._source.read_windows(rows, self.seq_len + 1)
        return self._windows[rows].long()

    def reset(self) -> None:
        """Back to the first batch of epoch 0 (e.g. before each validation pass)."""
        self.epoch = 0
        self.window_offset = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "window_offset": self.window_offset, "num_windows": self.num_windows}

    def load_state_dict(self, state: dict[str, int]) -> None:
        saved = int(state["num_windows"])
        if saved != self.num_windows:
            raise ConfigError(
                f"the checkpoint's {self.name} data-loader state was saved for {saved} windows of seq_len + 1 tokens, "
                f"but this run's data gives {self.num_windows}: data.source, data.tokenizer, data.val_fraction or "
                "training.seq_len changed. Resume with the data settings of the checkpoint."
            )
        offset = int(state["window_offset"])
        if not 0 <= offset <= self.num_windows:
            raise ConfigError(f"the checkpoint's {self.name} data-loader state has window_offset {offset} outside 0..{self.num_windows}.")
        self.epoch = int(state["epoch"])
        self.window_offset = offset

    def __repr__(self) -> str:
        return (
            f"TokenDataLoader({self.name}: {self.num_tokens} tokens, {self.num_windows} windows of {self.seq_len}+1, "
            f"global batch {self.global_batch_size}, rank {self.dp_rank}/{self.dp_world_size})"
        )

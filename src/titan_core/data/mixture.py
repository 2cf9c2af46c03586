"""Weighted mixtures of sources (``[data.mix.NAME] source=... weight=...``).

Every global batch of ``local_batch_size * dp_world_size`` rows is split among the
sources by a deficit rule: row after row, the source whose share so far lags its
weight the most (``w_k * (rows + 1) - rows_k``, ties to the first listed) gets the
row. Each source's share of rows, and so of tokens (every row is ``seq_len``
tokens), stays within one row of its weight at every step, for any layout. The
rows of a batch are then put in a seeded order (``seed``, batch number), and each
source reads its windows in its own seeded per-epoch permutation.

The state is the batch number and the rows each source has given (global counts),
so a checkpoint resumes on any data-parallel degree, like the single-source loader;
every rank computes the same global batch plan and reads only its own rows.
"""

from __future__ import annotations

import zlib
from typing import Any, Unpack

import torch

from ..errors import ConfigError
from .identity import stream_fingerprint
from .loader import RankBatches, RankLayout, WindowSource, epoch_order
from .permutation import LazyOrder

_BATCH_MIX = 0x2545F4914F6CDD1D
_MASK = (1 << 63) - 1


class _Windows:
    """One source's split, as windows of ``window`` tokens, read ``rows`` at a time."""

    def __init__(self, stream: torch.Tensor | WindowSource, window: int) -> None:
        self.window = window
        self._stream = stream
        self._fingerprint: str | None = None
        self.num_windows = int(stream.numel()) // window
        self._source = stream if isinstance(stream, WindowSource) else None
        self.lazy = self._source is not None
        self._table = None if isinstance(stream, WindowSource) else \
            stream[: self.num_windows * window].view(self.num_windows, window)

    def fingerprint(self) -> str:
        """A digest of the source's tokens (data/identity.py), computed once."""
        if self._fingerprint is None:
            self._fingerprint = stream_fingerprint(self._stream)
        return self._fingerprint

    def read(self, rows: torch.Tensor) -> torch.Tensor:
        if self._source is not None:
            return self._source.read_windows(rows, self.window)
        assert self._table is not None
        return self._table[rows].long()


class MixtureDataLoader(RankBatches):
    """Yields ``(inputs, labels)`` like :class:`TokenDataLoader`, each row from one source of the mixture."""

    def __init__(
        self,
        sources: list[tuple[str, float, torch.Tensor | WindowSource]],
        *,
        seq_len: int,
        local_batch_size: int,
        **layout: Unpack[RankLayout],
    ) -> None:
        if not sources:
            raise ValueError("a mixture needs at least one source")
        total = sum(w for _, w, _ in sources)
        self.names = [n for n, _, _ in sources]
        self.weights = [w / total for _, w, _ in sources]
        self.windows = [_Windows(s, seq_len + 1) for _, _, s in sources]
        self.sources = [""] * len(sources)  # each one's data source (build_mixture_loader sets them), for the record
        super().__init__(seq_len=seq_len, local_batch_size=local_batch_size, **layout)
        # Each source has its own window order, seeded from the run's seed and the source's name.
        self._seeds = [(self.seed * 1_000_003 + zlib.crc32(n.encode())) & _MASK for n in self.names]
        self._orders: dict[int, tuple[int, torch.Tensor | LazyOrder]] = {}  # source -> (epoch, its order)
        self.batch = 0
        self.rows = [0] * len(sources)

    def data_record(self) -> dict[str, dict[str, Any]]:
        """What a checkpoint records of this mixture's data (data/identity.py): each source's share and tokens."""
        return {f"data.mix.{name}": {"source": source, "weight": weight, "fingerprint": windows.fingerprint()}
                for name, source, weight, windows in zip(self.names, self.sources, self.weights, self.windows)}

    def _plan(self) -> list[int]:
        """The source of each row of the current global batch (the same on every rank)."""
        rows = list(self.rows)
        n = sum(rows)
        plan: list[int] = []
        for _ in range(self.global_batch_size):
            k = max(range(len(rows)), key=lambda i: (self.weights[i] * (n + 1) - rows[i], -i))
            plan.append(k)
            rows[k] += 1
            n += 1
        if self.shuffle:
            gen = torch.Generator().manual_seed((self.seed * _BATCH_MIX + self.batch) & _MASK)
            plan = [plan[i] for i in torch.randperm(len(plan), generator=gen).tolist()]
        return plan

    def _window(self, k: int, position: int) -> int:
        n = self.windows[k].num_windows
        epoch, offset = divmod(position, n)
        if not self.shuffle:
            return offset
        cached = self._orders.get(k)
        if cached is None or cached[0] != epoch:
            # shards: an order that holds no memory; text: torch.randperm, as the single-source loader
            order = LazyOrder(n, seed=self._seeds[k], epoch=epoch, shuffle=True) if self.windows[k].lazy \
                else epoch_order(n, self._seeds[k], epoch)
            cached = self._orders[k] = (epoch, order)
        return int(cached[1][offset])

    def __iter__(self) -> MixtureDataLoader:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        plan = self._plan()
        seen = list(self.rows)
        mine: list[tuple[int, int]] = []  # (source, its window) for this rank's rows
        lo = self.dp_rank * self.local_batch_size
        for j, k in enumerate(plan):
            if lo <= j < lo + self.local_batch_size:
                mine.append((k, self._window(k, seen[k])))
            seen[k] += 1
        self.rows = seen
        self.batch += 1
        out = torch.empty(self.local_batch_size, self.seq_len + 1, dtype=torch.int64)
        for k in sorted({k for k, _ in mine}):
            at = [i for i, (kk, _) in enumerate(mine) if kk == k]
            out[at] = self.windows[k].read(torch.tensor([mine[i][1] for i in at]))
        return out[:, :-1].contiguous(), out[:, 1:].contiguous()

    def reset(self) -> None:
        self.batch = 0
        self.rows = [0] * len(self.names)

    def state_dict(self) -> dict[str, int]:
        state = {"batch": self.batch}
        for name, rows, w in zip(self.names, self.rows, self.windows):
            state[f"rows_{name}"] = rows
            state[f"num_windows_{name}"] = w.num_windows
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, w in zip(self.names, self.windows):
            saved = state.get(f"num_windows_{name}")
            if saved is None or int(saved) != w.num_windows:
                raise ConfigError(
                    f"the checkpoint's {self.name} mixture state does not match data.mix.{name} "
                    f"({'no such source in the checkpoint' if saved is None else f'{saved} windows saved, {w.num_windows} now'}); "
                    "resume with the data settings of the checkpoint."
                )
        self.batch = int(state["batch"])
        self.rows = [int(state[f"rows_{name}"]) for name in self.names]

    def __repr__(self) -> str:
        parts = ", ".join(f"{n} {w:.3f} ({x.num_windows} windows)" for n, w, x in zip(self.names, self.weights, self.windows))
        return f"MixtureDataLoader({self.name}: {parts}; global batch {self.global_batch_size}, rank {self.dp_rank}/{self.dp_world_size})"


def source_tokens(state: dict[str, Any], seq_len: int) -> dict[str, float]:
    """``tokens_seen.NAME`` for each source of a mixture's state (global input tokens); {} for other loaders."""
    return {f"tokens_seen.{key[5:]}": float(int(v) * seq_len) for key, v in state.items()
            if key.startswith("rows_") and isinstance(v, int)}

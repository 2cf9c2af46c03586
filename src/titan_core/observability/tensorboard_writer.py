"""TensorBoard event files with the same scalars as metrics.jsonl (``--metrics.tensorboard=true``).

torch's ``SummaryWriter`` needs the ``tensorboard`` package, an optional extra
(``pip install 'titan-core[tensorboard]'``). Every rank checks that it is importable
when the metrics logger is built, so a missing package stops all ranks together with
one message instead of rank 0 alone; only rank 0 writes.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError

FOLDER = "tensorboard"


def require_tensorboard() -> None:
    """A ConfigError naming the extra to install when the tensorboard package is missing."""
    if importlib.util.find_spec("tensorboard") is None:
        raise ConfigError(
            "metrics.tensorboard=true needs the tensorboard package, which is not installed. Install it with "
            "pip install 'titan-core[tensorboard]' (or pip install tensorboard), or set --metrics.tensorboard=false."
        )


class TensorBoardWriter:
    """Writes each metrics record's numbers as scalars at the record's step, under ``run_dir/tensorboard``."""

    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.folder = run_dir / FOLDER
        self._writer: Any = SummaryWriter(log_dir=str(self.folder))

    def write(self, record: Mapping[str, float]) -> None:
        step = int(record["step"])
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)):
                self._writer.add_scalar(key, float(value), global_step=step)
        self._writer.flush()  # a crash or kill later still leaves every logged step readable

    def close(self) -> None:
        self._writer.close()


__all__ = ["FOLDER", "TensorBoardWriter", "require_tensorboard"]

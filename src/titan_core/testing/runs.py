"""Short training runs of ``python -m titan_core`` in a subprocess, and their per-step losses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

TINY_IMPORT = ("--import", "titan_core.testing.tiny_spec")


@dataclass(frozen=True)
class Run:
    returncode: int
    output: str
    losses: dict[int, float]
    grad_norms: dict[int, float] = field(default_factory=dict)

    def curve(self) -> list[float]:
        return [self.losses[s] for s in sorted(self.losses)]


def read_metrics(run_dir: Path) -> tuple[dict[int, float], dict[int, float]]:
    """step -> loss and step -> grad_norm from ``metrics.jsonl`` (a resumed run's later records replace earlier ones)."""
    path = run_dir / "metrics.jsonl"
    losses: dict[int, float] = {}
    grad_norms: dict[int, float] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if "loss" in record and "step" in record:
                losses[int(record["step"])] = float(record["loss"])
            if "grad_norm" in record and "step" in record:
                grad_norms[int(record["step"])] = float(record["grad_norm"])
    return losses, grad_norms


def train(run_dir: Path, base: list[str], *extra: str, nproc: int = 1, timeout: float = 600) -> Run:
    """Train with ``base + extra`` flags into ``run_dir`` (``nproc`` > 1: gloo processes)."""
    # No report.html: no check reads it, and drawing it costs each run about a second.
    cmd = [sys.executable, "-m", "titan_core", *base, *extra, f"--job.run_dir={run_dir}", "--metrics.log_freq=1",
           "--metrics.report=false"]
    if nproc > 1:
        cmd += ["--nproc-per-node", str(nproc)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        said = "".join(_text(out) for out in (exc.stdout, exc.stderr))
        return Run(124, f"timed out after {timeout:.0f} s: {' '.join(cmd)}\n{said}", {}, {})
    return Run(proc.returncode, proc.stdout + proc.stderr, *read_metrics(run_dir))


def max_rel_diff(a: list[float], b: list[float]) -> float:
    if len(a) != len(b) or not a:
        return float("inf")
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))


def tail(text: str, lines: int = 6) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _text(output: str | bytes | None) -> str:
    # TimeoutExpired keeps what was read so far as bytes, even under text=True (it was shown as b"...").
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""

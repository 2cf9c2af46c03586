"""Regenerate tests/golden/*.json: the first 20 losses of the debugmodel run in six layouts.

Each case trains the llama3 debugmodel on the built-in corpus snapshot (seq_len 64,
a global batch of 4 sequences, 20 steps, every other setting at its default) through
the real CLI and records the loss of every step. tests/test_golden_curves.py reruns
the cases and compares at 1e-6 relative, so a change that moves a curve fails until
this script is rerun, and the commit that reruns it says why the curve moved.

Usage: python scripts/make_golden_curves.py [CASE ...]   (default: every case)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden"
STEPS = 20
GLOBAL_BATCH = 4
COMMON = ("--spec", "llama3", "--flavor", "debugmodel", f"--training.steps={STEPS}", "--training.seq_len=64",
          "--metrics.log_freq=1", "--lr_scheduler.warmup_steps=2")
# name -> (processes, extra CLI arguments)
CASES: dict[str, tuple[int, tuple[str, ...]]] = {
    "single": (1, (f"--training.local_batch_size={GLOBAL_BATCH}",)),
    "fsdp2": (2, (f"--training.local_batch_size={GLOBAL_BATCH // 2}", "--parallelism.dp_shard=2")),
    "tp2": (2, (f"--training.local_batch_size={GLOBAL_BATCH}", "--parallelism.tp=2")),
    "pp2": (2, (f"--training.local_batch_size={GLOBAL_BATCH}", "--parallelism.pp=2")),
    "float8": (1, (f"--training.local_batch_size={GLOBAL_BATCH}", "--converters", "float8")),
    "mx": (1, (f"--training.local_batch_size={GLOBAL_BATCH}", "--converters", "mx")),
}


def cpu_kind() -> str:
    """"avx512" or "avx2" (or the machine's name): emulated low-precision casts round differently between
    them, so the float8 and MX curves are pinned per kind (``losses_by_cpu``); fp32 curves agree across them."""
    try:
        flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    except OSError:
        flags = ""
    words = set(flags.split())
    if "avx512f" in words:
        return "avx512"
    if "avx2" in words:
        return "avx2"
    import platform

    return platform.machine() or "unknown"


def case_command(name: str, run_dir: Path) -> list[str]:
    nproc, extra = CASES[name]
    launch = ["--nproc-per-node", str(nproc)] if nproc > 1 else []
    return [sys.executable, "-m", "titan_core", *launch, *COMMON, *extra, f"--job.run_dir={run_dir}"]


def run_case(name: str, run_dir: Path, *, timeout: float = 600) -> list[float]:
    """The per-step losses of one case, run in a fresh process (group) with one thread per process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(case_command(name, run_dir), cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"golden case {name} failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    if len(losses) != STEPS:
        raise RuntimeError(f"golden case {name}: {len(losses)} losses recorded, expected {STEPS}")
    return losses


def main(names: list[str]) -> int:
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        print(f"error: unknown case(s) {', '.join(unknown)}; cases: {', '.join(CASES)}", file=sys.stderr)
        return 2
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for name in names or list(CASES):
        with tempfile.TemporaryDirectory() as tmp:
            losses = run_case(name, Path(tmp) / "run")
        nproc, extra = CASES[name]
        record = {"case": name, "nproc": nproc, "args": [*COMMON, *extra], "torch": torch.__version__,
                  "losses": losses}
        path = GOLDEN / f"{name}.json"
        old = json.loads(path.read_text()) if path.is_file() else {}
        if "losses_by_cpu" in old:  # a per-CPU case: this machine's curve is replaced, the others kept
            record["losses"] = old["losses"]
            record["losses_by_cpu"] = {**old["losses_by_cpu"], cpu_kind(): losses}
        (GOLDEN / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
        print(f"{name}: {losses[0]:.6f} -> {losses[-1]:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

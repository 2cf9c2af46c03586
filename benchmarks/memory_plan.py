"""The dry run's memory plan against real peaks.

(a) CPU runs here. For each case the plan (``titan-train --dry-run`` with the same settings and
    ``--nproc-per-node``) is set against real 3-step runs of it (``--nproc-per-node`` on 2
    processes for the layouts; gloo), whose rank 0 logs its peak resident memory
    (``mem_peak_rss_gib`` in metrics.jsonl), run twice:
    - live: the heap hands every freed block of 64 KiB or more back at once
      (``MALLOC_MMAP_THRESHOLD_=65536``, ``--training.cpu_malloc_tuning=false``), so the resident
      peak is the peak of live tensors (it agrees with torch.profiler's memory events within
      0.03 GiB), set against the plan's ``live`` column;
    - resident: as a run is by default (freed memory stays in the heap), set against ``total``.
    The same case at 4 x 32 tokens (the process: torch, tokenizer, data, the model's states) is
    taken off both sides: the table compares what 8 x 1024 tokens add (activations, logits,
    buffers).
(b) torchtitan's published per-GPU memory (``benchmarks/llama3_h100_202412_torchtitan.md`` in
    pytorch/torchtitan, read with the ``fetch`` tool: H100 96 GB; every table of 8B, 70B and 405B,
    with the sequence length, batch and activation checkpointing each names) against the plan of
    the same layout, batch and schedule.

    python benchmarks/memory_plan.py [--only published|cpu] [--rows TEXT]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

BIN = Path(sys.executable).parent
GIB = 2**30

# name, processes, settings; every CPU case: llama3 debugmodel (width 256) cut to 2 layers, 8 x 1024 tokens
# (activations and logits dominate), against the same settings at 4 x 32 tokens (the process, the states).
MODEL = ["--spec", "llama3", "--flavor", "debugmodel", "--llama3.n_layers=2", "--training.seq_len=1024",
         "--training.local_batch_size=8"]
TINY = ["--training.seq_len=32", "--training.local_batch_size=4"]
CPU_CASES: list[tuple[str, int, list[str]]] = [
    ("single, AC none", 1, ["--activation_checkpoint.mode=none"]),
    ("single, AC full", 1, ["--activation_checkpoint.mode=full"]),
    ("single, AC selective (op)", 1, ["--activation_checkpoint.mode=selective"]),
    ("single, 3 layers, AC none", 1, ["--llama3.n_layers=3"]),
    ("FSDP2 dp_shard 2", 2, ["--parallelism.dp_shard=2"]),
    ("TP 2", 2, ["--parallelism.tp=2"]),
    ("TP 2, AC full", 2, ["--parallelism.tp=2", "--activation_checkpoint.mode=full"]),
    ("PP 2 (1F1B, 4 micro-batches)", 2, ["--parallelism.pp=2", "--parallelism.pp_microbatches=4"]),
    # 4 layers, a layer a stage: rank 0 holds 3 micro-batches of stage 0 and 2 of stage 2 at its peak
    ("PP 2 (Interleaved 1F1B x2, 4 layers, 4 micro-batches)", 2,
     ["--llama3.n_layers=4", "--parallelism.pp=2", "--parallelism.pp_microbatches=4",
      "--parallelism.pp_schedule=Interleaved1F1B", "--parallelism.pp_stages_per_rank=2"]),
]
# name, published GiB (max over ranks), settings. torchtitan's defaults at the benchmarks' commit (9dec370,
# 2024-12-26): seq 8192; under PP as many micro-batches as pipeline ranks (config_manager.py's
# pipeline_parallel_microbatches=None -> parallel_dims.pp), so local batch 32 runs 8 micro-batches of 4 for
# both schedules. (Later torchtitan defaults to micro-batch 1; the published runs predate that.) Tables 1
# and 3: the plain FSDP row (no compile, no float8), llama3_8b.toml's per-op selective AC; the others
# name full AC. The 262,144-token rows need the model's limit raised, as torchtitan's runs did.
FULL_AC = ["--activation_checkpoint.mode=full"]
LONG = ["--llama3.max_seq_len=262144"]
PUBLISHED: list[tuple[str, float, list[str]]] = [
    ("8B FSDP 8, 8 GPUs, local batch 2, selective AC (Table 1, FSDP)", 82.4,
     ["--flavor", "8B", "--nnodes", "1", "--nproc-per-node", "8", "--training.seq_len=8192",
      "--training.local_batch_size=2", "--activation_checkpoint.mode=selective"]),
    *[(f"8B FSDP {8 // cp}, CP {cp}, 8 GPUs, seq {seq:,}, local batch 1 (Table 2)", published,
       ["--flavor", "8B", "--nnodes", "1", "--nproc-per-node", "8", f"--parallelism.cp={cp}",
        f"--training.seq_len={seq}", "--training.local_batch_size=1", *FULL_AC, *LONG])
      for cp, seq, published in ((1, 32768, 83.9), (2, 65536, 84.2), (4, 131072, 84.0), (8, 262144, 84.5))],
    ("8B FSDP 128, 128 GPUs, local batch 2, selective AC (Table 3, FSDP)", 67.0,
     ["--flavor", "8B", "--nnodes", "16", "--nproc-per-node", "8", "--training.seq_len=8192",
      "--training.local_batch_size=2", "--activation_checkpoint.mode=selective"]),
    ("70B FSDP 32 x TP 8, 256 GPUs, local batch 16 (Table 4, 2D)", 71.9,
     ["--flavor", "70B", "--nnodes", "32", "--nproc-per-node", "8", "--parallelism.tp=8", "--training.seq_len=8192",
      "--training.local_batch_size=16", *FULL_AC]),
    ("405B FSDP 8 x TP 8 x PP 8, 512 GPUs, local batch 32, 1F1B (Table 5)", 82.5,
     ["--flavor", "405B", "--nnodes", "64", "--nproc-per-node", "8", "--parallelism.tp=8", "--parallelism.pp=8",
      "--training.seq_len=8192", "--training.local_batch_size=32", "--parallelism.pp_microbatches=8", *FULL_AC]),
    ("405B FSDP 8 x TP 8 x PP 8, 512 GPUs, local batch 32, Interleaved 1F1B x2 (Table 5)", 72.7,
     ["--flavor", "405B", "--nnodes", "64", "--nproc-per-node", "8", "--parallelism.tp=8", "--parallelism.pp=8",
      "--training.seq_len=8192", "--training.local_batch_size=32", "--parallelism.pp_microbatches=8",
      "--parallelism.pp_schedule=Interleaved1F1B", "--parallelism.pp_stages_per_rank=2", *FULL_AC]),
    *[(f"405B FSDP {8 // cp} x CP {cp} x TP 8 x PP 8, 512 GPUs, seq {seq:,}, local batch 8, 1F1B (Table 6)",
       published,
       ["--flavor", "405B", "--nnodes", "64", "--nproc-per-node", "8", "--parallelism.tp=8", "--parallelism.pp=8",
        f"--parallelism.cp={cp}", f"--training.seq_len={seq}", "--training.local_batch_size=8",
        "--parallelism.pp_microbatches=8", *FULL_AC, *LONG])
      for cp, seq, published in ((1, 32768, 75.3), (2, 65536, 75.9), (4, 131072, 77.1), (8, 262144, 84.9))],
]


def titan(*args: str, cwd: Path, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    return subprocess.run([str(BIN / "titan-train"), *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=1800)


def planned_rank0(args: list[str], nproc: int, cwd: Path) -> tuple[float, float]:
    """Rank 0's (live, total) from the plan (GiB)."""
    out = titan(*args, "--nproc-per-node", str(nproc), "--dry-run", "--target-device", "cpu", cwd=cwd)
    if out.returncode:
        raise SystemExit(out.stdout + out.stderr)
    row = _row_of_rank0(out.stdout)
    return float(row[-3]), float(row[-2])


def planned_peak(args: list[str], cwd: Path) -> tuple[float, float]:
    """(peak total, CPU seconds of the dry run)."""
    out = titan("--spec", "llama3", "--training.chunked_loss=false", *args,  # torchtitan's runs: the full logits
                "--dry-run", "--target-device", "95GiB", cwd=cwd)
    if out.returncode:
        raise SystemExit(out.stdout + out.stderr)
    peak = re.search(r"peak: ([\d,.]+) GiB", out.stdout)
    assert peak is not None, out.stdout
    return float(peak.group(1).replace(",", "")), 0.0


def _row_of_rank0(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["stage", "rank"])
    for line in lines[start + 1:]:
        cells = line.split()
        if len(cells) > 2 and cells[1] == "0":
            return cells
    raise AssertionError(text)


# The heap returns every freed block of 64 KiB or more at once: the resident peak is the live one.
LIVE_HEAP = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def measured_rank0(args: list[str], nproc: int, cwd: Path, name: str, *, live: bool) -> float:
    run_dir = cwd / re.sub(r"\W+", "_", name)
    launch = ["--nproc-per-node", str(nproc)] if nproc > 1 else []
    heap = ["--training.cpu_malloc_tuning=false"] if live else []
    out = titan(*args, *launch, *heap, "--training.steps=3", "--metrics.log_freq=1", "--checkpoint.enable=false",
                f"--job.run_dir={run_dir}", "--metrics.report=false", cwd=cwd, env_extra=LIVE_HEAP if live else None)
    if out.returncode:
        raise SystemExit(out.stdout + out.stderr)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return max(float(r["mem_peak_rss_gib"]) for r in records if "mem_peak_rss_gib" in r)


def cpu_table(cwd: Path, match: str = "") -> None:
    print("| case | ranks | plan live (GiB) | live peak (GiB) | plan / live | plan total (GiB) | resident peak (GiB) "
          "| plan / resident |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, nproc, settings in CPU_CASES:
        if match not in name:
            continue
        big, small = planned_rank0([*MODEL, *settings], nproc, cwd), planned_rank0([*MODEL, *settings, *TINY], nproc, cwd)
        plan_live, plan_total = big[0] - small[0], big[1] - small[1]
        runs = []
        for live in (True, False):
            runs.append(measured_rank0([*MODEL, *settings], nproc, cwd, name, live=live)
                        - measured_rank0([*MODEL, *settings, *TINY], nproc, cwd, f"base {name}", live=live))
        print(f"| {name} | {nproc} | {plan_live:.2f} | {runs[0]:.3f} | {plan_live / runs[0]:.2f} | {plan_total:.2f} "
              f"| {runs[1]:.3f} | {plan_total / runs[1]:.2f} |", flush=True)


def published_table(cwd: Path, match: str = "") -> None:
    print("| torchtitan layout (H100 96 GB) | published (GiB) | plan (GiB) | plan / published |")
    print("|---|---:|---:|---:|")
    for name, published, settings in PUBLISHED:
        if match not in name:
            continue
        plan, _ = planned_peak(settings, cwd)
        print(f"| {name} | {published:.1f} | {plan:.1f} | {plan / published:.2f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=("published", "cpu"))
    parser.add_argument("--rows", default="", help="only the rows (of either table) whose name holds this text")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.only != "cpu":
            published_table(Path(tmp), args.rows)
            print()
        if args.only != "published":
            cpu_table(Path(tmp), args.rows)


if __name__ == "__main__":
    main()

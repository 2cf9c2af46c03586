"""titan-core and torchtitan side by side on this CPU: step time, tokens/s, peak RSS per process,
time to first step; one process and FSDP2 x 2 (gloo).

The setting is torchtitan's ``llama3_debugmodel`` (6 layers, dim 256, AdamW, per-op selective
activation checkpointing, float32 parameters, batch 8 x 2048 per rank) and titan-core's llama3
``debugmodel`` with the same batch, AC mode, data file and tokenizer folder. torchtitan runs from
the recipe in ``<repo>/../shared/bench/torchtitan-cpu`` (a9c5edc74 with four CPU patches): point
``--tt-src`` (or ``TT_SRC``) at an unpacked copy and ``--tt-python`` at a Python with its
requirements. Without a torchtitan source the script says so and runs titan-core alone.

Each run is a fresh launch; the two frameworks alternate (titan, torchtitan, titan, ...), and
every run's figures are:

* step time: the median of the intervals between consecutive step lines for steps 3..``steps``
  (the same clock for both: the time the launcher's output shows the line);
* tokens/s: global tokens per step / that step time;
* peak RSS per process: the largest ``ru_maxrss`` of the launched process tree (``wait4``), i.e.
  the biggest rank, runtime, data and allocator caches included;
* time to first step: from the launch to the first step line.

    python benchmarks/vs_torchtitan.py [--tt-src DIR] [--tt-python PY] [--steps 8] [--rounds 1]
                                       [--layouts single,fsdp2] [--titan-args "..."]
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import Table

HERE = Path(__file__).resolve().parent
# The recipe sits in shared/bench/torchtitan-cpu beside the checkout (or above a worktree of it).
RECIPE = next((p / "shared" / "bench" / "torchtitan-cpu" for p in HERE.parents
               if (p / "shared" / "bench" / "torchtitan-cpu" / "run_torchtitan_cpu.sh").is_file()),
              HERE.parent.parent / "shared" / "bench" / "torchtitan-cpu")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
TITAN_STEP = re.compile(r"^(?:\[rank\d+\]:?\s*)?step\s+(\d+) \|")
TT_STEP = re.compile(r"step:\s*(\d+)\s+loss")


def titan_cmd(layout: str, steps: int, data: Path, tokenizer: Path, run_dir: Path, extra: list[str], *, batch: int,
              seq: int) -> list[str]:
    train = str(Path(sys.executable).with_name("titan-train"))
    cmd = [train, "--spec", "llama3", "--flavor", "debugmodel", f"--training.local_batch_size={batch}",
           f"--training.seq_len={seq}", f"--training.steps={steps}", "--activation_checkpoint.mode=selective",
           "--metrics.log_freq=1", "--optimizer.lr=8e-4", "--lr_scheduler.warmup_steps=2",
           f"--data.source={data}", f"--data.tokenizer={tokenizer}", f"--job.run_dir={run_dir}", *extra]
    if layout == "fsdp2":
        cmd += ["--parallelism.dp_shard=2", "--nproc-per-node", "2"]
    return cmd


def tt_cmd(layout: str, steps: int, tt_src: Path, tt_python: str, *, batch: int, seq: int) -> tuple[list[str], dict[str, str]]:
    env = {"TT_SRC": str(tt_src), "PYTHON": tt_python, "STEPS": str(steps),
           "NPROC": "2" if layout == "fsdp2" else "1"}
    cmd = ["bash", str(RECIPE / "run_torchtitan_cpu.sh"), "--metrics.log_freq", "1",
           "--training.local_batch_size", str(batch), "--training.seq_len", str(seq)]
    if layout == "fsdp2":
        cmd += ["--parallelism.data_parallel_shard_degree", "2"]
    return cmd, env


def run(cmd: list[str], env: dict[str, str], pattern: re.Pattern[str], steps: int, log: Path) -> dict[str, float]:
    """Launch ``cmd``; step lines' arrival times, then the process tree's peak RSS."""
    start = time.monotonic()
    seen: dict[int, float] = {}
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", **env}, start_new_session=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            m = pattern.search(ANSI.sub("", line))
            if m and int(m.group(1)) not in seen:
                seen[int(m.group(1))] = time.monotonic() - start
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0 or len(seen) < steps:
        raise SystemExit(f"{shlex.join(cmd)} failed (exit {proc.returncode}, {len(seen)} step lines); see {log}")
    intervals = [seen[k] - seen[k - 1] for k in range(3, steps + 1)]
    return {"step_s": statistics.median(intervals), "first_s": seen[1], "rss_gib": usage.ru_maxrss / 2**20}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tt-src", default=os.environ.get("TT_SRC", ""))
    parser.add_argument("--tt-python", default=os.environ.get("TT_PYTHON", "python"))
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8, help="sequences per rank")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--layouts", default="single,fsdp2")
    parser.add_argument("--titan-args", default="", help="more titan-train flags, e.g. --training.chunked_loss=false")
    parser.add_argument("--logs", default="", help="folder for the runs' logs (default: a temporary one)")
    args = parser.parse_args()
    if args.steps < 4:
        parser.error("--steps must be at least 4 (the median is over steps 3..steps)")
    tt_src = Path(args.tt_src) if args.tt_src else None
    if tt_src is None or not (tt_src / "torchtitan" / "train.py").is_file():
        print(f"torchtitan source not found ({args.tt_src or 'no --tt-src / TT_SRC'}): titan-core runs alone; "
              f"unpack torchtitan a9c5edc74 as {RECIPE / 'run_torchtitan_cpu.sh'} explains and pass --tt-src.")
        tt_src = None
    tokenizer = (tt_src or Path()) / "tests" / "assets" / "tokenizer"
    data = (tt_src or Path()) / "tests" / "assets" / "standin_prose" / "data.json"
    if tt_src is None or not data.is_file() or not tokenizer.is_dir():
        tokenizer, data = Path("builtin"), Path("builtin")
        if tt_src is not None:
            print(f"{data} or {tokenizer} missing: titan-core reads the built-in corpus and tokenizer")
    logs = Path(args.logs) if args.logs else Path(tempfile.mkdtemp(prefix="vs-torchtitan-"))
    logs.mkdir(parents=True, exist_ok=True)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; logs in {logs}", flush=True)
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    for r in range(args.rounds):
        for layout in args.layouts.split(","):
            cmd = titan_cmd(layout, args.steps, data, tokenizer, logs / f"titan-{layout}-{r}", shlex.split(args.titan_args),
                            batch=args.batch, seq=args.seq_len)
            results.setdefault(("titan", layout), []).append(
                run(cmd, {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}, TITAN_STEP, args.steps,
                    logs / f"titan-{layout}-{r}.log"))
            print(f"titan {layout} round {r}: {results[('titan', layout)][-1]}", flush=True)
            if tt_src is not None:
                cmd, env = tt_cmd(layout, args.steps, tt_src, args.tt_python, batch=args.batch, seq=args.seq_len)
                results.setdefault(("torchtitan", layout), []).append(
                    run(cmd, env, TT_STEP, args.steps, logs / f"torchtitan-{layout}-{r}.log"))
                print(f"torchtitan {layout} round {r}: {results[('torchtitan', layout)][-1]}", flush=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"\nllama3 debugmodel, batch {args.batch} x {args.seq_len} per rank, per-op selective AC, median of steps 3-{args.steps}, "
          f"{args.rounds} round(s), {time.strftime('%Y-%m-%d')}")
    table = Table(("layout", "<8"), ("framework", "<12"), ("step s", ">9"), ("tokens/s", ">10"),
                  ("peak RSS GiB", ">14"), ("first step s", ">14"))
    table.print_header()
    for layout in args.layouts.split(","):
        world = 2 if layout == "fsdp2" else 1
        med = {}
        for fw in ("titan", "torchtitan"):
            runs = results.get((fw, layout))
            if not runs:
                continue
            m = {k: statistics.median(x[k] for x in runs) for k in runs[0]}
            med[fw] = m
            table.print_row(layout, fw, f"{m['step_s']:.2f}", f"{args.batch * args.seq_len * world / m['step_s']:.0f}",
                            f"{m['rss_gib']:.2f}", f"{m['first_s']:.1f}")
        if len(med) == 2:
            t, tt = med["titan"], med["torchtitan"]
            table.print_row(layout, "ratio", f"{t['step_s'] / tt['step_s']:.2f}", f"{tt['step_s'] / t['step_s']:.2f}",
                            f"{t['rss_gib'] / tt['rss_gib']:.2f}", f"{t['first_s'] / tt['first_s']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

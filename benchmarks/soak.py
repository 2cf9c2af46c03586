"""Soak: resident memory of one long training run, step by step (does it stay flat?).

One process trains the llama3 spec's debugmodel (2 layers, seq 64, batch 2, no checkpoints, the
built-in corpus) for --steps steps, in this process, and prints its resident set size (RSS, from
/proc/self/statm) every --every steps, then the growth from step --base to the last step, in
percent and in bytes per step. The target: at most 3% from step 1,000 to step 20,000. With
--tracemalloc, the Python allocation sites that grew most between step --base and the end are
printed too (slower: use it on a short run to find a leak).

    OMP_NUM_THREADS=1 python benchmarks/soak.py                          # 20,000 steps (about 15 min)
    OMP_NUM_THREADS=1 python benchmarks/soak.py --steps 2000 --base 200 --every 200 --tracemalloc
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import tracemalloc
from typing import Any

from _common import int_parser


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main() -> int:
    parser = int_parser(__doc__, steps=20000, base=1000, every=1000, seq_len=64, batch=2, layers=2)
    parser.add_argument("--tracemalloc", action="store_true", help="print the allocation sites that grew most")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="another setting for the run, e.g. --set training.cpu_malloc_tuning=false")
    args = parser.parse_args()
    if not 0 < args.base < args.steps:
        parser.error("--base must lie between 0 and --steps")

    from titan_core.plan.resolve import resolve_config
    from titan_core.train.trainer import Trainer

    samples: dict[int, int] = {}
    snapshots: dict[str, Any] = {}

    class Sampled(Trainer):  # type: ignore[misc]
        def step_metrics(self) -> dict[str, float]:  # called at every logged step: sample there
            samples[self.step] = rss_bytes()
            if args.tracemalloc and self.step == args.base:
                snapshots["base"] = tracemalloc.take_snapshot()
            return {}

    every = min(args.every, args.base)
    with tempfile.TemporaryDirectory(prefix="titan-soak-") as run_dir:
        resolved = resolve_config(config_source=None, world_size=1, override_pairs=[
            ("model.spec", "llama3"), ("model.flavor", "debugmodel"), ("llama3.n_layers", str(args.layers)),
            ("training.seq_len", str(args.seq_len)), ("training.local_batch_size", str(args.batch)),
            ("training.steps", str(args.steps)), ("checkpoint.enable", "false"), ("metrics.log_freq", str(every)),
            ("metrics.report", "false"), ("validation.enable", "false"), ("job.run_dir", run_dir),
            *(tuple(item.split("=", 1)) for item in args.set),
        ])
        if args.tracemalloc:
            tracemalloc.start(6)
        trainer = Sampled(resolved)
        t0 = time.perf_counter()
        trainer.setup()
        trainer.train()
        seconds = time.perf_counter() - t0
        if args.tracemalloc:
            snapshots["end"] = tracemalloc.take_snapshot()

    print(f"\nsoak: llama3 debugmodel, {args.layers} layers, seq {args.seq_len}, batch {args.batch}, "
          f"{args.steps:,} steps in {seconds:.0f} s, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '-')}, "
          f"load average {os.getloadavg()[0]:.1f}" + (f", {' '.join(args.set)}" if args.set else ""))
    print(f"{'step':>8}  {'RSS MiB':>9}  {'vs base':>8}")
    base = samples.get(args.base)
    for step in sorted(s for s in samples if s % args.every == 0 or s in (args.base, args.steps)):
        rel = f"{100 * (samples[step] / base - 1):+.2f}%" if base else "-"
        print(f"{step:>8,}  {samples[step] / 2**20:>9.1f}  {rel:>8}")
    last = max(samples)
    if base:
        grown = samples[last] - base
        print(f"\nRSS at step {last:,} is {100 * (samples[last] / base - 1):+.2f}% vs step {args.base:,} "
              f"({grown / max(1, last - args.base):+,.0f} bytes/step); target: at most +3%")
    if args.tracemalloc and "base" in snapshots:
        print("\nPython allocations that grew most from step", args.base, "to the end:")
        for stat in snapshots["end"].compare_to(snapshots["base"], "traceback")[:8]:
            print(f"  {stat.size_diff / 1024:+9.1f} KiB in {stat.count_diff:+,} blocks")
            for line in stat.traceback.format()[-6:]:
                print("     ", line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

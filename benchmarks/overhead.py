"""Trainer overhead and CPU MFU: titan-train's Trainer vs a minimal hand-written loop.

Both variants train the same model (the llama3 spec's Transformer) with the same batch,
AdamW, gradient clipping and seed, fp32, one process, no activation checkpointing.
Each variant runs in its own subprocess (so peak RSS is its own), alternating A/B/A/B
so machine noise hits both alike. Printed: steady-state step time (median over the
measured steps), peak RSS, tokens/s, the ratio Trainer / hand loop (target <= 1.03),
and CPU MFU = model FLOP/s against two stated yardsticks, both printed:

* the measured fp32 matmul rate: the best of a few matmul shapes and thread settings, measured
  at start; the winning setting is timed again right after each measured step (the host's speed
  drifts) and the larger figure is used; the median over steps and rounds is printed. This is
  what torch's own GEMM reaches here, not the CPU's limit: a fused kernel can beat it;
* the CPU's nominal peak: cores x fp32 FLOP per cycle (SIMD lanes x 2 per FMA x 2 FMA units)
  x clock (sysfs's nominal maximum, else the clock /proc/cpuinfo reports), see
  ``_common.nominal_cpu_peak``.

The model FLOPs count causal attention as computed (half the square; the full-square figure, as
published MFU numbers count it, is printed beside it).

    python benchmarks/overhead.py                      # debugmodel, vocab 2048, batch 8 x seq 2048
    python benchmarks/overhead.py --compile            # the same with torch.compile per block
    python benchmarks/overhead.py --attention sdpa     # ATen's flash kernel instead of the fused one
    python benchmarks/overhead.py --seq-len 256 --steps 6 --rounds 1   # a quick look
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from _common import int_parser, nominal_cpu_peak

WORKER = r"""
import json, resource, statistics, sys, time
import torch
args = json.loads(sys.argv[1])
torch.manual_seed(0)
# Both variants (and the reference matmul) run with the allocator setting the Trainer applies on CPU.
from titan_core.runtime.cpu_allocator import keep_freed_memory_in_heap
keep_freed_memory_in_heap()

def matmul_flops(n, threads, reps):
    # fp32 FLOP/s of an n^3 a @ b with `threads` threads, best of `reps`
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(n, n), torch.randn(n, n)
        a @ b
        times = []
        for _ in range(reps):
            t = time.perf_counter(); a @ b; times.append(time.perf_counter() - t)
        return 2 * n**3 / min(times)
    finally:
        torch.set_num_threads(saved)

# The host's peak is the best of a few shapes and thread settings (one shape at one setting can
# sit well below it, which let MFU exceed 1); the setting that wins is then timed after each step.
import os
SHAPES = tuple(args["matmul_sizes"])
THREADS = sorted({torch.get_num_threads(), len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()})
grid = {(n, th): matmul_flops(n, th, reps=3) for n in SHAPES for th in THREADS}
best_setting = max(grid, key=grid.get)
def reference_flops(reps=1):
    return max(grid[best_setting], matmul_flops(*best_setting, reps=reps))

from titan_core import Trainer
from titan_core.plan.resolve import resolve_config
# The spec is named: a default install holds two (llama3 and qwen3), and the hand loop is llama3's model.
overrides = [("model.spec", "llama3"), ("training.seq_len", str(args["seq_len"])), ("training.local_batch_size", str(args["batch"])),
             ("training.steps", "1000"), ("metrics.log_freq", "1000000"), ("job.run_dir", args["run_dir"]),
             ("llama3.vocab_size", str(args["vocab"])), ("lr_scheduler.warmup_steps", "2"),
             ("compile.enable", "true" if args["compile"] else "false"),
             ("llama3.attention_kernel", args["attention"])]
resolved = resolve_config(config_source=None, override_pairs=overrides)
trainer = Trainer(resolved)
trainer.setup()
batches = iter(trainer.dataloader)
if args["variant"] == "trainer":
    step = lambda: trainer.train_step(batches)
else:
    # The minimal hand-written loop over the same model, data and optimizer settings.
    from titan_llama.model import Transformer
    model = Transformer(trainer.model_args)
    model.init_weights(seed=0)
    if args["compile"]:  # the same per-block compilation the Trainer applies
        for block in model.layers.values():
            block.compile(fullgraph=True)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, foreach=True)
    def step():
        x, y = next(batches)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten(0, 1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
times, step_mfus, step_mfus_full = [], [], []
tokens = args["batch"] * args["seq_len"]
fpt = trainer.metrics.flops_per_token
for i in range(args["warmup"] + args["steps"]):
    t = time.perf_counter(); step(); dt = time.perf_counter() - t
    if i >= args["warmup"]:
        times.append(dt)
        # The host's speed drifts: each step is set against a matmul timed right after it.
        # Never below the best measured at start, so a slow moment cannot inflate MFU.
        ref = reference_flops()
        step_mfus.append(fpt.computed * tokens / dt / ref)
        step_mfus_full.append(fpt.full_attention * tokens / dt / ref)
print(json.dumps({"step_s": statistics.median(times), "rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                  "matmul_flops": reference_flops(reps=5), "matmul_n": best_setting[0], "matmul_threads": best_setting[1],
                  "flops_per_token": fpt.computed, "flops_per_token_full": fpt.full_attention,
                  "mfu": statistics.median(step_mfus),
                  "mfu_full": statistics.median(step_mfus_full)}))
"""


def run(variant: str, a: argparse.Namespace) -> dict[str, float]:
    payload = json.dumps({"variant": variant, "seq_len": a.seq_len, "batch": a.batch, "vocab": a.vocab,
                          "warmup": a.warmup, "steps": a.steps, "compile": a.compile,
                          "attention": a.attention, "matmul_sizes": a.matmul_sizes,
                          "run_dir": f"/tmp/titan-overhead-{variant}"})
    out = subprocess.run([sys.executable, "-c", WORKER, payload], capture_output=True, text=True)
    if out.returncode != 0:  # show the worker's own error, not just its exit status
        sys.exit(f"the {variant} worker failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = int_parser(__doc__, seq_len=2048, batch=8, vocab=2048, warmup=2, steps=5, rounds=2)
    p.add_argument("--compile", action="store_true", help="torch.compile each block in both variants")
    p.add_argument("--attention", choices=["auto", "sdpa"], default="auto",
                   help="llama3.attention_kernel: auto (the fused CPU kernel) or sdpa (ATen's flash kernel)")
    p.add_argument("--matmul-sizes", type=lambda v: [int(x) for x in v.split(",")], default=[1024, 2048, 4096],
                   help="square matmul sizes whose best fp32 FLOP/s is the CPU's peak (comma-separated)")
    a = p.parse_args()
    results: dict[str, list[dict[str, float]]] = {"trainer": [], "hand loop": []}
    for _ in range(a.rounds):
        results["trainer"].append(run("trainer", a))
        results["hand loop"].append(run("hand", a))
    tokens = a.batch * a.seq_len
    mode = ("torch.compile per block" if a.compile else "eager") + f", attention {a.attention}"
    print(f"debugmodel shape, vocab {a.vocab}, batch {a.batch} x seq {a.seq_len}, fp32, 1 process, {mode}, "
          f"torch {__import__('torch').__version__}")
    peak = nominal_cpu_peak()
    nominal = peak["flops"]
    print(f"{'variant':<10} {'step s':>8} {'tokens/s':>9} {'peak RSS GiB':>12} {'model GFLOP/s':>13} "
          f"{'MFU/matmul':>10} {'full-sq':>8} {'MFU/peak':>9} {'full-sq':>8}")
    summary = {}
    for name, runs in results.items():
        step = statistics.median(r["step_s"] for r in runs)
        mfu = statistics.median(r["mfu"] for r in runs)
        mfu_full = statistics.median(r["mfu_full"] for r in runs)
        rss = max(r["rss_gib"] for r in runs)
        summary[name] = step
        model_flops = runs[0]["flops_per_token"] * tokens / step
        full_flops = runs[0]["flops_per_token_full"] * tokens / step
        vs_peak = (f"{model_flops / nominal:>9.3f} {full_flops / nominal:>8.3f}" if isinstance(nominal, float)
                   else f"{'n/a':>9} {'n/a':>8}")
        print(f"{name:<10} {step:>8.3f} {tokens / step:>9.0f} {rss:>12.2f} {model_flops / 1e9:>13.2f} "
              f"{mfu:>10.3f} {mfu_full:>8.3f} {vs_peak}")
    best = max((r for rs in results.values() for r in rs), key=lambda r: r["matmul_flops"])
    print(f"fp32 matmul reference (best of {', '.join(f'{n}^3' for n in a.matmul_sizes)} x thread settings): "
          f"{best['matmul_flops'] / 1e9:.1f} GFLOP/s at {best['matmul_n']}^3, {best['matmul_threads']} threads")
    clock = f"{peak['ghz']:.3f} GHz" if isinstance(peak["ghz"], float) else "unknown"
    nominal_text = f"{nominal / 1e9:.1f} GFLOP/s" if isinstance(nominal, float) else "unknown (no clock readable)"
    print(f"nominal fp32 peak: {nominal_text} = {peak['cores']} cores x {peak['flop_per_cycle']} FLOP/cycle "
          f"({peak['isa']}: lanes x 2 per FMA x 2 FMA units) x {clock} (clock from {peak['clock_from']})")
    print("MFU/matmul = model FLOP/s / the measured fp32 matmul rate (torch's GEMM here; a fused kernel can beat "
          "it, so this can exceed 1); MFU/peak = model FLOP/s / the nominal peak. Model FLOPs count causal "
          "attention as computed (the unmasked half of the square); full-sq counts the whole seq_len^2 square, "
          "as published MFU figures do.")
    print(f"step-time ratio trainer / hand loop: {summary['trainer'] / summary['hand loop']:.3f} (target <= 1.03)")


if __name__ == "__main__":
    main()

"""Trainer overhead and CPU MFU: titan-train's Trainer vs a minimal hand-written loop.

Both variants train the same model (the llama3 spec's Transformer) with the same batch,
AdamW, gradient clipping and seed, fp32, one process, no activation checkpointing.
Each variant runs in its own subprocess (so peak RSS is its own), alternating A/B/A/B
so machine noise hits both alike. Printed: steady-state step time (median over the
measured steps), peak RSS, tokens/s, the ratio Trainer / hand loop (target <= 1.03),
and CPU MFU = model FLOP/s / this machine's fp32 matmul FLOP/s (a 4096^3 a @ b timed
right after each measured step, in the same subprocess, since the host's speed drifts;
the median over steps and rounds is printed).

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
import time

WORKER = r"""
import json, resource, statistics, sys, time
import torch
args = json.loads(sys.argv[1])
torch.manual_seed(0)
# Both variants (and the reference matmul) run with the allocator setting the Trainer applies on CPU.
from titan_core.cpu_allocator import keep_freed_memory_in_heap
keep_freed_memory_in_heap()

def matmul_flops(n=4096, reps=5):
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    times = []
    for _ in range(reps):
        t = time.perf_counter(); a @ b; times.append(time.perf_counter() - t)
    return 2 * n**3 / min(times)

from titan_core import Trainer
from titan_core.config.resolve import resolve_config
overrides = [("training.seq_len", str(args["seq_len"])), ("training.local_batch_size", str(args["batch"])),
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
times, step_mfus = [], []
tokens = args["batch"] * args["seq_len"]
for i in range(args["warmup"] + args["steps"]):
    t = time.perf_counter(); step(); dt = time.perf_counter() - t
    if i >= args["warmup"]:
        times.append(dt)
        # The host's speed drifts: each step is set against a matmul timed right after it.
        step_mfus.append(trainer.metrics.flops_per_token * tokens / dt / matmul_flops(reps=1))
print(json.dumps({"step_s": statistics.median(times), "rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                  "matmul_flops": matmul_flops(), "flops_per_token": trainer.metrics.flops_per_token,
                  "mfu": statistics.median(step_mfus)}))
"""


def run(variant: str, a: argparse.Namespace) -> dict[str, float]:
    payload = json.dumps({"variant": variant, "seq_len": a.seq_len, "batch": a.batch, "vocab": a.vocab,
                          "warmup": a.warmup, "steps": a.steps, "compile": a.compile,
                          "attention": a.attention,
                          "run_dir": f"/tmp/titan-overhead-{variant}"})
    out = subprocess.run([sys.executable, "-c", WORKER, payload], capture_output=True, text=True)
    if out.returncode != 0:  # show the worker's own error, not just its exit status
        sys.exit(f"the {variant} worker failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--compile", action="store_true", help="torch.compile each block in both variants")
    p.add_argument("--attention", choices=["auto", "sdpa"], default="auto",
                   help="llama3.attention_kernel: auto (the fused CPU kernel) or sdpa (ATen's flash kernel)")
    a = p.parse_args()
    results: dict[str, list[dict[str, float]]] = {"trainer": [], "hand loop": []}
    for _ in range(a.rounds):
        results["trainer"].append(run("trainer", a))
        results["hand loop"].append(run("hand", a))
    tokens = a.batch * a.seq_len
    mode = ("torch.compile per block" if a.compile else "eager") + f", attention {a.attention}"
    print(f"debugmodel shape, vocab {a.vocab}, batch {a.batch} x seq {a.seq_len}, fp32, 1 process, {mode}, "
          f"torch {__import__('torch').__version__}")
    print(f"{'variant':<10} {'step s':>8} {'tokens/s':>9} {'peak RSS GiB':>12} {'CPU MFU':>8}")
    summary = {}
    for name, runs in results.items():
        step = statistics.median(r["step_s"] for r in runs)
        mfu = statistics.median(r["mfu"] for r in runs)
        rss = max(r["rss_gib"] for r in runs)
        summary[name] = step
        print(f"{name:<10} {step:>8.3f} {tokens / step:>9.0f} {rss:>12.2f} {mfu:>8.2f}")
    matmul = statistics.median(r["matmul_flops"] for rs in results.values() for r in rs)
    print(f"fp32 matmul FLOP/s (4096^3, best of 5): {matmul / 1e9:.1f} GFLOP/s")
    print(f"step-time ratio trainer / hand loop: {summary['trainer'] / summary['hand loop']:.3f} (target <= 1.03)")


if __name__ == "__main__":
    main()

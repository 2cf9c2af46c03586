"""Peak memory and time of one loss step (head + cross-entropy, forward and backward): full logits
against the chunked loss (``titan_core.train.chunked_loss``), float32 on the CPU.

Each variant runs in a fresh process: it builds the hidden states [batch, seq, dim] (requiring
grad), a bias-free head [vocab, dim] and the labels, resets the kernel's peak-RSS mark
(``/proc/self/clear_refs``), runs the loss and its backward once, and reports the peak resident
memory (``VmHWM``) minus the resident memory before the step: what the loss step itself needs
on top of its inputs.
Defaults: vocabulary 128,256 (Llama 3), batch 4 x 2048, dim 256; the full-logits variant then
needs about 13 GiB, so the script first checks ``MemAvailable``.

    python benchmarks/chunked_loss_memory.py [--vocab 128256] [--batch 4] [--seq-len 2048] [--dim 256]
                                             [--chunk-tokens 0]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _common import Table


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return float("inf")


def child(variant: str, args: argparse.Namespace) -> None:
    import torch
    import torch.distributed.tensor  # noqa: F401  # imported by the chunked loss: not part of the step
    import torch.nn.functional as F

    from titan_core.train.chunked_loss import chunked_cross_entropy

    torch.manual_seed(0)
    head = torch.nn.Linear(args.dim, args.vocab, bias=False)
    hidden = torch.randn(args.batch, args.seq_len, args.dim, requires_grad=True)
    labels = torch.randint(0, args.vocab, (args.batch, args.seq_len))
    valid = labels.numel()
    Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) restarts from the current RSS
    before = status_kib("VmRSS")
    start = time.perf_counter()
    if variant == "full":
        loss = F.cross_entropy(head(hidden).flatten(0, 1).float(), labels.flatten())
    else:
        loss = chunked_cross_entropy(hidden, head, labels, valid=valid, chunk_tokens=args.chunk_tokens)
    loss.backward()
    seconds = time.perf_counter() - start
    peak = status_kib("VmHWM")
    print(json.dumps({"variant": variant, "loss": loss.item(), "seconds": seconds,
                      "step_peak_mib": (peak - before) / 1024}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=128_256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--chunk-tokens", type=int, default=0, help="0: the default chunk (64 MiB of logits)")
    parser.add_argument("--child", choices=("full", "chunked"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args)
        return 0
    logits_gib = args.batch * args.seq_len * args.vocab * 4 / 2**30
    need = 3.5 * logits_gib + 1
    if available_gib() < need:
        print(f"only {available_gib():.1f} GiB available; the full-logits variant needs about {need:.1f} GiB. "
              f"Free memory or pass a smaller --vocab/--batch.", file=sys.stderr)
        return 1
    results = {}
    for variant in ("full", "chunked"):
        cmd = [sys.executable, __file__, "--child", variant, *sys.argv[1:]]
        out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS":
                             os.environ.get("OMP_NUM_THREADS", "2")}, check=False)
        if out.returncode != 0:
            print(out.stdout + out.stderr, file=sys.stderr)
            return 1
        results[variant] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"loss step (head + cross-entropy, forward + backward), float32: vocabulary {args.vocab:,}, "
          f"batch {args.batch} x {args.seq_len}, dim {args.dim}; full logits {logits_gib:.2f} GiB")
    table = Table(("variant", "<10"), ("step peak MiB", ">15"), ("seconds", ">10"), ("loss", ">12"))
    table.print_header()
    for variant, r in results.items():
        table.print_row(variant, f"{r['step_peak_mib']:.0f}", f"{r['seconds']:.2f}", f"{r['loss']:.6f}")
    full, chunked = results["full"], results["chunked"]
    print(f"chunked / full: peak memory {chunked['step_peak_mib'] / full['step_peak_mib']:.3f}, "
          f"time {chunked['seconds'] / full['seconds']:.2f}, loss difference {abs(chunked['loss'] - full['loss']):.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

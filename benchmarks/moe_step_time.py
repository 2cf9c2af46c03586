"""Step time of qwen3 ``debugmoe`` against a dense qwen3 with the same active parameters.

``debugmoe`` routes each token to 2 of 8 experts of hidden size 256; the dense reference
(``debugmodel``'s shape) has one MLP of hidden size 512, so both do the same MLP matmuls
per token (the MoE adds its router, the dispatch and the combine). Both train on the same
batch of random tokens, one process, fp32, with AdamW; the median of ``--steps`` timed
steps (forward, backward, optimizer) is printed for each, and their ratio.

Time is the CPU time of the one compute thread (``--threads 1``, the default): on a shared
machine the wall clock measures the other processes as much as the model (a loaded 2-core
machine gave 1.3x to 2.9x for the same code), while one thread's CPU time does not depend
on them. The wall-clock median is printed beside it.

    python benchmarks/moe_step_time.py [--seq-len 256 --batch 8 --steps 10 --threads 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

from titan_core.moe import MoEMonitor
from titan_qwen3.flavors import qwen3_flavors
from titan_qwen3.model import Transformer, parameter_counts


def step_times(model: torch.nn.Module, tokens: torch.Tensor, *, warmup: int,
               steps: int) -> tuple[list[float], list[float]]:
    """(CPU seconds of this thread, wall seconds) of each timed step."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    monitor = MoEMonitor([model])  # the trainer's MoE bookkeeping, included in the MoE's time
    cpu, wall = [], []
    for i in range(warmup + steps):
        start, start_cpu = time.perf_counter(), time.thread_time()
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        aux = monitor.after_forward()
        (loss if aux is None else loss + aux).backward()
        optimizer.step()
        monitor.after_step()
        optimizer.zero_grad()
        if i >= warmup:
            cpu.append(time.thread_time() - start_cpu)
            wall.append(time.perf_counter() - start)
    return cpu, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads; with more than one, the CPU figure is the main thread's only")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    moe_args = dataclasses.replace(qwen3_flavors["debugmoe"], vocab_size=args.vocab)
    dense_args = dataclasses.replace(qwen3_flavors["debugmodel"], vocab_size=args.vocab)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq_len + 1), generator=torch.Generator().manual_seed(0))
    rows = []
    for name, model_args in (("dense (debugmodel)", dense_args), ("MoE (debugmoe)", moe_args)):
        torch.manual_seed(0)
        model = Transformer(model_args)
        model.init_weights(seed=0)
        total, active = parameter_counts(model_args)
        cpu, wall = step_times(model, tokens, warmup=args.warmup, steps=args.steps)
        rows.append((name, total, active, statistics.median(cpu), statistics.median(wall)))
    print(f"batch {args.batch} x seq {args.seq_len}, fp32, {torch.get_num_threads()} threads, "
          f"median of {args.steps} steps")
    print(f"{'model':<20} {'params':>12} {'active':>12} {'step ms':>9} {'wall ms':>9}")
    for name, total, active, median, wall_median in rows:
        print(f"{name:<20} {total:>12,} {active:>12,} {median * 1000:>9.1f} {wall_median * 1000:>9.1f}")
    print(f"MoE / dense step time: {rows[1][3] / rows[0][3]:.2f}x (wall clock: {rows[1][4] / rows[0][4]:.2f}x)")


if __name__ == "__main__":
    main()

"""Where a one-process training step's peak resident memory goes, part by part.

The setting of ``vs_torchtitan.py``: llama3 ``debugmodel``, batch 8 x 2048, per-op selective
activation checkpointing, AdamW, float32, the given data file and tokenizer (default: the
built-in ones). One fresh process per call, which adds each part in the order a run does and
reads ``VmRSS`` after it (``VmHWM``, reset through ``/proc/self/clear_refs``, for the step):

1. Python, torch and the libraries a run imports (torch.distributed's DTensor and FSDP2, the
   plugins): the resident memory before anything is built;
2. data and tokenizer: ``build_tokenizer`` + ``build_dataloader`` + one batch;
3. parameters, gradients, optimizer states: counted from the tensors (float32 bytes), and the
   resident memory after the optimizer's first step beside them;
4. one step's transient peak (forward + backward), split into the loss part (the head's logits
   and the cross-entropy, measured as the same step's peak with the loss left out) and the rest
   (activations saved for backward, recomputation, the attention kernel's buffers);
5. allocator caches: what stays resident after the step beyond the live tensors (freed heap pages
   glibc keeps; with ``--malloc-tuning`` on, all of them).

    python benchmarks/memory_breakdown.py [--data builtin --tokenizer builtin] [--loss chunked|full]
                                          [--malloc-tuning true|false] [--steps 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

MIB = 2**20


def status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="builtin")
    parser.add_argument("--tokenizer", default="builtin")
    parser.add_argument("--loss", choices=("chunked", "full"), default="chunked")
    parser.add_argument("--malloc-tuning", choices=("true", "false"), default="false")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()

    import torch
    import torch.distributed.fsdp  # noqa: F401  # a run imports these: part of the runtime's share
    import torch.distributed.tensor  # noqa: F401
    import torch.nn.functional as F

    from titan_core import build_dataloader, build_tokenizer
    from titan_core.models.model_parts import hidden_states_for_loss
    from titan_core.parallel.one_process import parallelize_alone
    from titan_core.runtime.cpu_allocator import keep_freed_memory_in_heap
    from titan_core.train.chunked_loss import chunked_cross_entropy
    from titan_llama.flavors import llama3_flavors
    from titan_llama.model import Transformer
    from titan_llama.parallelize import parallelize_llama

    if args.malloc_tuning == "true":
        keep_freed_memory_in_heap()
    parts: list[tuple[str, float]] = []
    runtime = status_mib("VmRSS")
    parts.append(("Python, torch, libraries (imports)", runtime))

    tok = build_tokenizer(args.tokenizer)
    loader = build_dataloader(source=args.data, tokenizer=tok, seq_len=args.seq_len, local_batch_size=args.batch,
                              dp_rank=0, dp_world_size=1, seed=0)
    batches = iter(loader)
    inputs, labels = next(batches)
    after_data = status_mib("VmRSS")
    parts.append((f"data and tokenizer ({args.data}, {args.tokenizer})", after_data - runtime))

    import dataclasses

    margs = dataclasses.replace(llama3_flavors["debugmodel"], vocab_size=tok.vocab_size, max_seq_len=args.seq_len)
    model = Transformer(margs)
    model.init_weights(0)
    model = parallelize_alone(parallelize_llama, model, mode="selective")  # default sections, one process
    optimizer = torch.optim.AdamW(model.parameters(), lr=8e-4, foreach=True)
    n_params = sum(p.numel() for p in model.parameters())

    def step(with_loss: bool) -> None:
        """One training step; without the loss, a trivial one on the hidden states (no head, no logits)."""
        optimizer.zero_grad(set_to_none=True)
        valid = int(labels.ne(-100).sum())
        if args.loss == "full" and with_loss:
            loss = F.cross_entropy(model(inputs).flatten(0, 1).float(), labels.flatten())
        else:
            with hidden_states_for_loss() as request:
                out = model(inputs)
            assert request.head is not None
            loss = chunked_cross_entropy(out, request.head, labels, valid=valid) if with_loss else out.square().mean()
        loss.backward()
        optimizer.step()

    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step(True)
        times.append(time.perf_counter() - start)
    state_bytes = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
                      if isinstance(t, torch.Tensor))
    before_step = status_mib("VmRSS")
    reset_peak()
    step(True)
    peak = status_mib("VmHWM")
    reset_peak()
    step(False)
    peak_without_loss = status_mib("VmHWM")
    after = status_mib("VmRSS")

    params_mib = n_params * 4 / MIB
    parts.append(("parameters", params_mib))
    parts.append(("gradients", params_mib))
    parts.append(("optimizer states (AdamW exp_avg, exp_avg_sq)", state_bytes / MIB))
    held = before_step - after_data
    parts.append(("allocator caches, buffers, other memory resident after a step", held - 2 * params_mib - state_bytes / MIB))
    parts.append(("activations and step buffers (transient)", peak_without_loss - before_step))
    parts.append((f"logits and loss, {args.loss} (transient)", max(0.0, peak - peak_without_loss)))
    print(f"llama3 debugmodel ({n_params:,} parameters, vocabulary {tok.vocab_size}), batch {args.batch} x "
          f"{args.seq_len}, per-op selective AC, AdamW, float32, loss {args.loss}, malloc tuning "
          f"{args.malloc_tuning}; step {min(times):.2f} s (best of {args.steps})")
    print(f"{'part':<62}{'MiB':>8}")
    for name, mib in parts:
        print(f"{name:<62}{mib:>8.0f}")
    print(f"{'sum = peak resident memory of the step':<62}{peak:>8.0f}")
    print(f"resident after the step {after:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

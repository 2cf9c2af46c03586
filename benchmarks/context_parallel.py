"""Context parallelism: activation memory per rank against sequence length, and attention work balance.

For each cp degree, ``cp`` gloo processes each build the model (llama3 debugmodel, the layers asked
for), take their chunks of one sequence of ``--seq-len`` tokens, and run one forward and the loss
under the context-parallel attention (``cp`` = 1: one process, the model's own attention). Measured
on each rank:

* activation memory: the bytes autograd saves for the backward (every tensor the saved-tensor hooks
  see, counted once per storage, parameters left out): what the activations of a training step
  hold at their peak, before the backward frees them;
* attention work: the query-key pairs the rank's attention computed (the kernel's own count of the
  blocks it ran, a diagonal block counting its lower triangle), whose max / mean over ranks is the
  balance (1.0: every rank the same work).

    python benchmarks/context_parallel.py                       # seq 16384, cp 1 and 4, 2 layers
    python benchmarks/context_parallel.py --seq-len 1024 --cps 1,2
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _common import Table, int_parser


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, cp: int, port: int, seq_len: int, layers: int, load_balance: bool, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=cp)
    from titan_core.models.init import init_model_weights
    from titan_core.parallel.context_attention import AttentionWork
    from titan_core.parallel.context_parallel import ContextParallel, prepare_model
    from titan_core.plan.resolve import resolve_config
    from titan_core.train.build import build_meta_model

    resolved = resolve_config(config_source=None, world_size=1, override_pairs=[
        ("model.spec", "llama3"), ("model.flavor", "debugmodel"), ("llama3.n_layers", str(layers)),
        ("llama3.max_seq_len", str(seq_len)), ("training.seq_len", str(seq_len))])
    model = build_meta_model(resolved).model
    if cp > 1:
        prepare_model(model, spec_name="llama3", cp=cp)
    model.to_empty(device="cpu")
    init_model_weights(model, seed=0)
    vocab = resolved.model_args.vocab_size
    tokens = torch.randint(0, vocab, (1, seq_len), generator=torch.Generator().manual_seed(0))
    labels = tokens.roll(-1, dims=1)
    positions, work = None, AttentionWork()
    context: object = torch.enable_grad()
    if cp > 1:
        parallel = ContextParallel(group=dist.group.WORLD, seq_len=seq_len, load_balance=load_balance,
                                   document_masking=False)
        parallel.work = work
        tokens, labels, positions = parallel.shard_batch(tokens, labels, None)
        context = parallel.attention(positions)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with context, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(tokens) if positions is None else model(tokens, positions=positions)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
    loss.backward()
    pairs = sum(work.pairs) if cp > 1 else layers * seq_len * (seq_len + 1) / 2
    Path(out, f"{rank}.json").write_text(json.dumps({"saved": sum(saved.values()), "pairs": pairs}))
    dist.destroy_process_group()


def measure(cp: int, *, seq_len: int, layers: int, load_balance: bool) -> list[dict[str, float]]:
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_rank, args=(cp, _free_port(), seq_len, layers, load_balance, out), nprocs=cp, join=True)
        return [json.loads(Path(out, f"{r}.json").read_text()) for r in range(cp)]


def main() -> None:
    parser = int_parser(__doc__, seq_len=16384, layers=2)
    parser.add_argument("--cps", default="1,4", help="comma-separated cp degrees; the first is the baseline")
    args = parser.parse_args()
    cps = [int(c) for c in args.cps.split(",")]
    print(f"llama3 debugmodel, {args.layers} layers, one sequence of {args.seq_len} tokens, float32, CPU (gloo)")
    table = Table(("cp", "<4"), ("load balance", "<14"), ("activations MiB/rank", ">22"), ("vs first", ">10"),
                  ("attention max/mean", ">20"))
    table.print_header()
    base = None
    cases = [(cp, True) for cp in cps] + [(cp, False) for cp in cps if cp > 1]
    for cp, balanced in cases:
        ranks = measure(cp, seq_len=args.seq_len, layers=args.layers, load_balance=balanced)
        peak = max(r["saved"] for r in ranks)
        base = base or peak
        pairs = [r["pairs"] for r in ranks]
        table.print_row(str(cp), "yes" if balanced else "no (contiguous)", f"{peak / 2**20:.1f}", f"{peak / base:.3f}",
                        f"{max(pairs) / (sum(pairs) / len(pairs)):.3f}")


if __name__ == "__main__":
    main()

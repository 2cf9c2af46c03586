"""The fused CPU attention kernel vs ATen's flash kernel (SDPA), forward and backward.

Both run causal float32 attention on the same inputs, alternating call by call so that
machine noise hits both alike; the table shows the median time of each and the ratio
SDPA / fused (above 1: the fused kernel is faster). Shapes keep dim = heads x head_dim
= 256, as in debugmodel; the first row is debugmodel's own attention.

    python benchmarks/attention.py
    python benchmarks/attention.py --batch 2 --seq-len 512 --repeats 5   # a quick look
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from _common import int_parser

from titan_llama import cpu_attention


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def compare(batch: int, seq_len: int, heads: int, head_dim: int, repeats: int) -> dict[str, float]:
    g = torch.Generator().manual_seed(0)
    q, k, v, grad = (torch.randn(batch, seq_len, heads, head_dim, generator=g) for _ in range(4))
    # SDPA's fastest CPU layout is contiguous [b, h, s, d] (what the model gives it).
    qt, kt, vt = (t.transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
    grad_t = grad.transpose(1, 2).contiguous()
    qf, kf, vf = (t.clone().requires_grad_() for t in (q, k, v))
    sdpa_out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
    fused_out, _ = cpu_attention.causal_attention(qf, kf, vf)
    times: dict[str, list[float]] = {"sdpa fwd": [], "sdpa bwd": [], "fused fwd": [], "fused bwd": []}
    for _ in range(repeats + 1):  # the first round warms up
        times["sdpa fwd"].append(_timed(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)))
        times["sdpa bwd"].append(_timed(lambda: torch.autograd.grad(sdpa_out, (qt, kt, vt), grad_t, retain_graph=True)))
        times["fused fwd"].append(_timed(lambda: cpu_attention.causal_attention(qf, kf, vf)))
        times["fused bwd"].append(_timed(lambda: torch.autograd.grad(fused_out, (qf, kf, vf), grad, retain_graph=True)))
    return {name: statistics.median(ts[1:]) for name, ts in times.items()}


def main() -> None:
    a = int_parser(__doc__, batch=8, seq_len=2048, repeats=7).parse_args()
    print(f"causal attention, fp32, batch {a.batch} x seq {a.seq_len}, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}")
    print(f"{'heads x dim':<12} {'sdpa fwd ms':>11} {'fused fwd ms':>12} {'fwd x':>6} "
          f"{'sdpa bwd ms':>11} {'fused bwd ms':>12} {'bwd x':>6} {'fwd+bwd x':>9}")
    for head_dim in cpu_attention.SUPPORTED_HEAD_DIMS:
        heads = 256 // head_dim
        t = compare(a.batch, a.seq_len, heads, head_dim, a.repeats)
        total = (t["sdpa fwd"] + t["sdpa bwd"]) / (t["fused fwd"] + t["fused bwd"])
        print(f"{f'{heads} x {head_dim}':<12} {t['sdpa fwd'] * 1e3:>11.1f} {t['fused fwd'] * 1e3:>12.1f} "
              f"{t['sdpa fwd'] / t['fused fwd']:>6.2f} {t['sdpa bwd'] * 1e3:>11.1f} {t['fused bwd'] * 1e3:>12.1f} "
              f"{t['sdpa bwd'] / t['fused bwd']:>6.2f} {total:>9.2f}")


if __name__ == "__main__":
    main()

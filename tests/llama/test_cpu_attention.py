"""The fused CPU attention op against float64 attention by its formula, plus its fallbacks.

The reference is written out here: scores q k^T / sqrt(d), a causal mask, softmax, times v,
with key/value heads repeated for grouped-query attention; gradients come from autograd
on that float64 graph.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from titan_llama import cpu_attention


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """[b, s, h, d] float64 causal attention by its definition."""
    group = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)
    scores = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(q.shape[-1])
    s = q.shape[1]
    mask = torch.ones(s, s, dtype=torch.bool).tril()
    probs = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    return torch.einsum("bhij,bjhd->bihd", probs, v)


def _inputs(b: int, s: int, h: int, hkv: int, d: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(b, s, h, d), (b, s, hkv, d), (b, s, hkv, d), (b, s, h, d)]
    return [torch.randn(shape, generator=g) * 2 for shape in shapes]


@pytest.mark.parametrize(
    "b,s,h,hkv,d",
    [(2, 37, 4, 4, 16), (1, 1, 2, 1, 16), (3, 130, 8, 2, 16), (2, 65, 4, 1, 32), (1, 70, 2, 2, 64)],
    ids=["odd-len", "one-token", "gqa-4", "mqa-d32", "d64"],
)
def test_matches_the_formula_forward_and_backward(b: int, s: int, h: int, hkv: int, d: int) -> None:
    assert cpu_attention.load_kernel(d) is not None, "the kernel must build on this machine"
    q, k, v, grad = _inputs(b, s, h, hkv, d)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, lse = cpu_attention.causal_attention(q, k, v)
    out.backward(grad)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = reference_attention(q64, k64, v64)
    ref.backward(grad.double())
    torch.testing.assert_close(out.double(), ref.detach(), atol=2e-5, rtol=1e-5)
    for ours, theirs in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        torch.testing.assert_close(ours.double(), theirs, atol=5e-5, rtol=1e-5)
    # The saved logsumexp is the log of each row's softmax denominator.
    scores = torch.einsum("bihd,bjhd->bhij", q64, k64.repeat_interleave(h // hkv, 2)) / math.sqrt(d)
    masked = scores.masked_fill(~torch.ones(s, s, dtype=torch.bool).tril(), float("-inf"))
    torch.testing.assert_close(lse.double(), masked.logsumexp(-1).detach(), atol=1e-5, rtol=1e-5)


def test_strided_inputs_give_the_same_result() -> None:
    # q, k, v as views into one fused projection: rows are strided, channels contiguous.
    q, k, v, _ = _inputs(2, 33, 4, 4, 16)
    packed = torch.cat([q, k, v], dim=2)
    views = packed[:, :, :4], packed[:, :, 4:8], packed[:, :, 8:]
    assert not views[1].is_contiguous()
    torch.testing.assert_close(cpu_attention.causal_attention(*views)[0], cpu_attention.causal_attention(q, k, v)[0])


def test_runs_with_one_thread_and_is_deterministic() -> None:
    q, k, v, _ = _inputs(2, 50, 4, 2, 16)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = cpu_attention.causal_attention(q, k, v)[0]
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(single, cpu_attention.causal_attention(q, k, v)[0])


def test_supports_only_plain_float32_cpu_tensors_of_known_head_sizes() -> None:
    q, k, v, _ = _inputs(1, 8, 4, 2, 16)
    assert cpu_attention.supports(q, k, v)
    assert not cpu_attention.supports(q.double(), k.double(), v.double())
    assert not cpu_attention.supports(q[..., :8], k[..., :8], v[..., :8])  # head_dim 8
    assert not cpu_attention.supports(*(t.to(torch.bfloat16) for t in (q, k, v)))


def test_compiled_kernel_is_cached_and_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TITAN_CACHE_DIR", str(tmp_path))
    first = cpu_attention._build(16)
    assert first.parent == tmp_path / "kernels" and first.exists()
    stamp = first.stat().st_mtime_ns
    assert cpu_attention._build(16) == first and first.stat().st_mtime_ns == stamp
    assert [p.name for p in (tmp_path / "kernels").iterdir()] == [first.name]  # no temporary left behind


_FALLBACK_SCRIPT = textwrap.dedent(
    """
    import logging, math, torch
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    from titan_llama import cpu_attention
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 40, h, 16, generator=g).requires_grad_() for h in (4, 2, 2))
    out, _ = cpu_attention.causal_attention(q, k, v)
    out.square().sum().backward()
    assert cpu_attention.load_kernel(16) is None
    kr, vr = k.repeat_interleave(2, 2), v.repeat_interleave(2, 2)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), kr.transpose(1, 2), vr.transpose(1, 2), is_causal=True).transpose(1, 2)
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    ref2 = torch.nn.functional.scaled_dot_product_attention(
        q2.transpose(1, 2), k2.repeat_interleave(2, 2).transpose(1, 2), v2.repeat_interleave(2, 2).transpose(1, 2),
        is_causal=True).transpose(1, 2)
    ref2.square().sum().backward()
    print("max diff", max((a - b).abs().max().item() for a, b in
                          ((out, ref), (q.grad, q2.grad), (k.grad, k2.grad), (v.grad, v2.grad))))
    """
)


def test_without_a_compiler_the_op_falls_back_to_aten_and_says_so(tmp_path: Path) -> None:
    env = {**os.environ, "CXX": str(tmp_path / "no-such-compiler"), "TITAN_CACHE_DIR": str(tmp_path / "cache")}
    result = subprocess.run([sys.executable, "-c", _FALLBACK_SCRIPT], capture_output=True, text=True, env=env,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert "fused CPU attention unavailable (no C++ compiler" in result.stderr
    assert "using ATen's flash kernel" in result.stderr
    diff = float(result.stdout.split("max diff")[1])
    assert diff < 1e-5

"""The fused CPU causal-attention kernel (``cpu_attention.cpp``), as a torch custom op.

Causal, or block-causal with ``starts`` (document masking in a packed window: query
``i`` sees keys ``starts[b, i] .. i``, its own document only).

The kernel is compiled for this machine on first use (``c++ -O3 -march=native
-fopenmp``, about 2 s) and cached under ``$TITAN_CACHE_DIR`` (default
``$XDG_CACHE_HOME/titan`` or ``~/.cache/titan``), keyed by the source, the compiler,
its flags and the CPU. Where it cannot be built (no C++ compiler, say) the op runs
ATen's CPU flash kernel instead and says why once in the log: a run never fails
because of it.

It is a ``torch.library.custom_op`` with a fake implementation and a registered
backward, so ``torch.compile(fullgraph=True)``, activation checkpointing and
autograd treat it like any ATen op.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import logging
import math
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from titan_core.runtime.torch_compat import cpu_flash_attention, cpu_flash_attention_backward

logger = logging.getLogger(__name__)

# Head sizes it is compiled for: where it measured at least as fast as ATen's flash
# kernel (1.4x at 16, about even at 32 and 64; docs/benchmarks.md). Above 64 ATen's
# GEMM-based kernel wins.
SUPPORTED_HEAD_DIMS = (16, 32, 64)

_SOURCE = Path(__file__).with_name("cpu_attention.cpp")
_FLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-shared", "-fPIC")


class _Strides(ctypes.Structure):
    _fields_ = [("b", ctypes.c_int64), ("s", ctypes.c_int64), ("h", ctypes.c_int64)]


def _strides(t: Tensor) -> _Strides:
    return _Strides(t.stride(0), t.stride(1), t.stride(2))


def cache_dir() -> Path:
    """Where compiled kernels are kept."""
    if os.environ.get("TITAN_CACHE_DIR"):
        return Path(os.environ["TITAN_CACHE_DIR"]) / "kernels"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "titan" / "kernels"


def _cpu_signature() -> str:
    """The CPU features -march=native compiles for: a cached kernel is only reused on the same kind."""
    flags = ""
    with contextlib.suppress(OSError):  # no /proc/cpuinfo: key by the architecture alone
        flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith(("flags", "Features"))), "")
    return f"{platform.machine()} {flags}"


def _build(head_dim: int) -> Path:
    compiler = os.environ.get("CXX", "c++")
    flags = (*_FLAGS, f"-DHEAD_DIM={head_dim}")
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeError(f"no C++ compiler ({compiler!r}: {exc}); set CXX to one") from None
    key = hashlib.sha256("\0".join([_SOURCE.read_text(), compiler, version, *flags, _cpu_signature()]).encode())
    target = cache_dir() / f"cpu_attention_d{head_dim}_{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: concurrent processes never load a half-written file.
    partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    result = subprocess.run([compiler, *flags, "-o", str(partial), str(_SOURCE)],
                            capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"{compiler} failed: {result.stderr.strip()[-500:]}")
    os.replace(partial, target)
    return target


@functools.cache
def load_kernel(head_dim: int) -> ctypes.CDLL | None:
    """The compiled kernel for ``head_dim``, or None (logged once) where it cannot be built."""
    if head_dim not in SUPPORTED_HEAD_DIMS:
        return None
    try:
        lib = ctypes.CDLL(str(_build(head_dim)))
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        logger.warning("fused CPU attention unavailable (%s); using ATen's flash kernel", exc)
        return None
    p, i64, s = ctypes.c_void_p, ctypes.c_int64, _Strides
    lib.titan_attention_forward.argtypes = [p, s, p, s, p, s, p, s, p, p, i64, i64, i64, i64, ctypes.c_float,
                                            ctypes.c_int]
    lib.titan_attention_backward.argtypes = [p, s, p, s, p, s, p, s, p, s, p, p, s, p, s, p, s, p,
                                             i64, i64, i64, i64, ctypes.c_float, ctypes.c_int]
    assert lib.titan_attention_head_dim() == head_dim
    return lib


@functools.cache
def faster_than_aten() -> bool:
    """Whether this CPU is one where the kernel was measured faster than ATen's flash kernel: with AVX-512,
    whose 16-lane registers hold a 16-channel head whole (1.4x at 16 channels, even at 32 and 64 on a
    Sapphire Rapids host). With AVX2 alone the compiler's own vectorisation of it is several times slower
    than ATen's (0.10-0.17x forward and backward on a Zen 3 host; docs/benchmarks.md), so ``auto`` leaves
    plain causal attention to SDPA there. Read from the CPU's flags: the same answer on every run."""
    flags = _cpu_signature().split()
    return "avx512f" in flags


def supports(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether the op takes these inputs: plain float32 CPU tensors of a supported head size."""
    return all(type(t) is torch.Tensor and t.device.type == "cpu" and t.dtype == torch.float32 for t in (q, k, v)) \
        and q.shape[-1] in SUPPORTED_HEAD_DIMS and q.shape[2] % k.shape[2] == 0


def _unit_last_stride(*tensors: Tensor) -> tuple[Tensor, ...]:
    """The kernel takes any batch/sequence/head strides but needs each head's channels adjacent."""
    return tuple(t if t.stride(-1) == 1 else t.contiguous() for t in tensors)


def document_starts(positions: Tensor) -> Tensor:
    """Each token's document start (``index - position``), int64 [b, s], from positions that restart at 0."""
    return torch.arange(positions.shape[1], device=positions.device) - positions.long()


def _checked_starts(starts: Tensor | None, q: Tensor) -> Tensor | None:
    """``starts`` as the kernel reads it (contiguous int64), refused unless block-causal.

    The kernel indexes memory with these values, so they are checked, not trusted: each
    in ``0 .. i`` and never decreasing along a row (documents are contiguous).
    """
    if starts is None:
        return None
    b, s = q.shape[:2]
    starts = starts.to(torch.int64).contiguous()
    index = torch.arange(s)
    if starts.shape != (b, s) or bool((starts < 0).any()) or bool((starts > index).any()) \
            or bool((starts[:, 1:] < starts[:, :-1]).any()):
        raise ValueError(f"document starts must be [{b}, {s}], each in 0..its own index and non-decreasing "
                         f"along a row (from positions that restart at 0 at each document); got {tuple(starts.shape)}")
    return starts


def _dense_masked(q: Tensor, k: Tensor, v: Tensor, starts: Tensor) -> tuple[Tensor, Tensor]:
    """Block-causal attention written out in float32 (the fallback when the kernel cannot be built)."""
    group = q.shape[2] // k.shape[2]
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)))
    index = torch.arange(q.shape[1])
    visible = (index[None, :] <= index[:, None])[None] & (index[None, None, :] >= starts[:, :, None])
    scores = (qt @ kt.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~visible[:, None], -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.exp(scores - lse[..., None]) @ vt
    return out.transpose(1, 2).contiguous(), lse.contiguous()


def _dense_masked_backward(grad: Tensor, q: Tensor, k: Tensor, v: Tensor,
                           starts: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    with torch.enable_grad():
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        out, _ = _dense_masked(q, k, v, starts)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad)
    return dq, dk, dv


def _aten_flash_forward(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """The fallback: ATen's flash kernel on [b, h, s, d] views, kv heads repeated for GQA."""
    group = q.shape[2] // k.shape[2]
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)))
    out, lse = cpu_flash_attention(qt, kt, vt, causal=True)
    return out.transpose(1, 2).contiguous(), lse.contiguous()


def _aten_flash_backward(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                         lse: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The fallback's backward; the repeated kv heads' gradients are summed back per kv head."""
    hkv = k.shape[2]
    group = q.shape[2] // hkv
    kr, vr = k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)
    dq, dk, dv = cpu_flash_attention_backward(
        grad.transpose(1, 2), q.transpose(1, 2), kr.transpose(1, 2), vr.transpose(1, 2),
        out.transpose(1, 2), lse, causal=True)
    dq, dk, dv = (t.transpose(1, 2) for t in (dq, dk, dv))
    return dq.contiguous(), dk.unflatten(2, (hkv, group)).sum(3), dv.unflatten(2, (hkv, group)).sum(3)


@torch.library.custom_op("titan_llama::causal_attention", mutates_args=())
def causal_attention(q: Tensor, k: Tensor, v: Tensor, starts: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Causal attention over [b, s, heads, d] inputs: (out [b, s, h, d], logsumexp [b, h, s]).

    ``starts`` (int [b, s], optional): query ``i`` sees only keys ``starts[b, i] .. i``.
    """
    q, k, v = _unit_last_stride(q, k, v)
    starts = _checked_starts(starts, q)
    lib = load_kernel(q.shape[-1])
    if lib is None:
        return _aten_flash_forward(q, k, v) if starts is None else _dense_masked(q, k, v, starts)
    b, s, h, d = q.shape
    out = torch.empty((b, s, h, d), dtype=q.dtype)
    lse = torch.empty((b, h, s), dtype=torch.float32)
    failed = lib.titan_attention_forward(
        q.data_ptr(), _strides(q), k.data_ptr(), _strides(k), v.data_ptr(), _strides(v),
        out.data_ptr(), _strides(out), lse.data_ptr(), None if starts is None else starts.data_ptr(),
        b, h, k.shape[2], s, 1.0 / math.sqrt(d), torch.get_num_threads(),
    )
    if failed:
        raise MemoryError("fused CPU attention: could not allocate its scratch buffers")
    return out, lse


@causal_attention.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, starts: Tensor | None = None) -> tuple[Tensor, Tensor]:
    b, s, h, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((b, h, s))


@torch.library.custom_op("titan_llama::causal_attention_backward", mutates_args=())
def causal_attention_backward(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                              starts: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of ``causal_attention``, from its inputs, output and logsumexp."""
    grad, q, k, v = _unit_last_stride(grad, q, k, v)
    starts = _checked_starts(starts, q)
    b, s, h, d = q.shape
    lib = load_kernel(d)
    if lib is None:
        if starts is not None:
            return _dense_masked_backward(grad, q, k, v, starts)
        return _aten_flash_backward(grad, q, k, v, out, lse)
    dq, dk, dv = (torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))
    failed = lib.titan_attention_backward(
        q.data_ptr(), _strides(q), k.data_ptr(), _strides(k), v.data_ptr(), _strides(v),
        out.data_ptr(), _strides(out), grad.data_ptr(), _strides(grad), lse.data_ptr(),
        dq.data_ptr(), _strides(dq), dk.data_ptr(), _strides(dk), dv.data_ptr(), _strides(dv),
        None if starts is None else starts.data_ptr(), b, h, k.shape[2], s, 1.0 / math.sqrt(d),
        torch.get_num_threads(),
    )
    if failed:
        raise MemoryError("fused CPU attention backward: could not allocate its scratch buffers")
    return dq, dk, dv


@causal_attention_backward.register_fake
def _(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
      starts: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
    q, k, v, starts = inputs
    ctx.masked = starts is not None
    ctx.save_for_backward(q, k, v, *output, *([starts] if starts is not None else []))


def _backward(ctx: Any, grad_out: Tensor, grad_lse: Tensor | None) -> tuple[Tensor, Tensor, Tensor, None]:
    q, k, v, out, lse, *starts = ctx.saved_tensors
    dq, dk, dv = causal_attention_backward(grad_out, q, k, v, out, lse, starts[0] if ctx.masked else None)
    return dq, dk, dv, None


causal_attention.register_autograd(_backward, setup_context=_setup_context)

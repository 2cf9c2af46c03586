"""Per-step metrics: one console line every ``log_freq`` steps, JSONL, optional W&B."""

from __future__ import annotations

import json
import resource
from pathlib import Path
from typing import Any

import torch

from ..config.sections import MetricsSection
from ..plugin.spec_factories import FlopsPerToken
from .tensorboard_writer import TensorBoardWriter, require_tensorboard

# Dense bf16 peak TFLOP/s (no sparsity) by a fragment of torch.cuda.get_device_name(), for MFU.
# The longest matching fragment wins, so "H100 PCIe" is not read as an SXM H100, nor "L40S" as "L4".
PEAK_BF16_TFLOPS: dict[str, float] = {
    "GB200": 2500.0,
    "B200": 2250.0,
    "H200": 989.0,  # SXM ("NVIDIA H200")
    "H200 NVL": 835.0,
    "H100": 989.0,  # SXM ("NVIDIA H100 80GB HBM3")
    "H100 PCIe": 756.0,
    "H100 NVL": 835.0,
    "H800": 989.0,
    "A100": 312.0,
    "A800": 312.0,
    "L40S": 362.0,
    "L40": 181.0,
    "L4": 121.0,
    "MI300X": 1307.0,
}


def peak_flops(device: torch.device, configured_tflops: float | None) -> float | None:
    """Peak FLOP/s for MFU: the configured figure, else the table; None when unknown (e.g. CPU)."""
    if configured_tflops is not None:
        return configured_tflops * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    matches = [fragment for fragment in PEAK_BF16_TFLOPS if fragment in name]
    if not matches:
        return None
    return PEAK_BF16_TFLOPS[max(matches, key=len)] * 1e12


def reset_peak_memory(device: torch.device) -> None:
    """Start the peak-memory figures afresh (CUDA; a CPU's peak resident set size cannot be reset)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def memory_stats(device: torch.device) -> dict[str, float]:
    """GiB: max allocated/reserved on CUDA, peak resident set size on CPU."""
    if device.type == "cuda":
        return {
            "mem_max_allocated_gib": torch.cuda.max_memory_allocated(device) / 2**30,
            "mem_max_reserved_gib": torch.cuda.max_memory_reserved(device) / 2**30,
        }
    # ru_maxrss is in KiB on Linux.
    return {"mem_peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


class MetricsLogger:
    """Rank 0 prints and records; other ranks only keep the numbers."""

    def __init__(
        self,
        config: MetricsSection,
        *,
        run_dir: Path,
        is_rank0: bool,
        device: torch.device,
        flops_per_token: FlopsPerToken | None,
        world_size: int,
        run_config: dict[str, Any] | None = None,
    ) -> None:
        self.config = config
        self.is_rank0 = is_rank0
        self.device = device
        self.flops_per_token = flops_per_token
        self.world_size = world_size
        self.peak = peak_flops(device, config.peak_tflops)
        self.path = run_dir / "metrics.jsonl"
        self._wandb: Any = None
        self._tensorboard: Any = None
        if config.tensorboard:
            require_tensorboard()  # on every rank: a missing package stops all of them with one message
            self._tensorboard = TensorBoardWriter(run_dir) if is_rank0 else None
        if is_rank0 and config.wandb:
            import wandb  # imported only when asked for: it is slow to import

            self._wandb = wandb.init(project=config.wandb_project, dir=str(run_dir), config=run_config or {})

    def should_log(self, step: int, *, last: bool) -> bool:
        return step == 1 or last or step % self.config.log_freq == 0

    def log_step(
        self, *, step: int, loss: float, grad_norm: float, lr: float, tokens: float, step_time: float, extra: dict[str, float]
    ) -> dict[str, float]:
        """Record one training step; ``tokens`` is this device's share of the step's tokens."""
        tps_rank = tokens / step_time if step_time > 0 else 0.0
        record: dict[str, float] = {
            "step": step, "loss": loss, "grad_norm": grad_norm, "lr": lr,
            "tokens_per_s": tps_rank, "tokens_per_s_total": tps_rank * self.world_size,
            "step_time_s": step_time, **memory_stats(self.device), **extra,
        }
        fpt = self.flops_per_token
        if fpt is not None:
            record["tflops"] = fpt.computed * tps_rank / 1e12
            if self.peak is not None:
                record["mfu"] = fpt.computed * tps_rank / self.peak
                record["mfu_full_attention"] = fpt.full_attention * tps_rank / self.peak
        self._emit(record, self._line(record))
        return record

    def log_validation(self, *, step: int, loss: float) -> None:
        self._emit({"step": step, "val_loss": loss}, f"step {step:>6} | validation loss {loss:.4f}")

    def log_evaluation(self, *, step: int, results: dict[str, float]) -> None:
        """The ``[eval]`` figures of ``step`` (``eval/<task>/<figure>``) as one record."""
        shown = " | ".join(f"{k.removeprefix('eval/')} {v:.4f}" for k, v in results.items() if not k.endswith("/examples"))
        self._emit({"step": step, **results}, f"step {step:>6} | eval | {shown}")

    def _line(self, r: dict[str, float]) -> str:
        mem = r.get("mem_max_allocated_gib", r.get("mem_peak_rss_gib", 0.0))
        parts = [
            f"step {int(r['step']):>6}", f"loss {r['loss']:.4f}", f"grad_norm {r['grad_norm']:.3f}",
            f"lr {r['lr']:.2e}", f"tok/s {r['tokens_per_s']:,.0f}", f"step {r['step_time_s'] * 1000:.0f}ms",
            f"mem {mem:.2f}GiB",
        ]
        if "moe_load_imbalance" in r:
            aux = f", aux loss {r['moe_aux_loss']:.4f}" if "moe_aux_loss" in r else ""
            parts.append(f"moe load max/mean {r['moe_load_imbalance']:.2f}{aux}")
        if "moe_grouped_mm" in r:  # which path the experts' matmuls took
            share = r["moe_grouped_mm"]
            parts.append("experts " + ("grouped_mm" if share == 1 else "loop" if share == 0 else f"grouped_mm in {share:.0%}"))
        if "data_ms" in r:
            parts.insert(6, f"data {r['data_ms']:.1f}ms")
        mix = {k.removeprefix("tokens_seen."): v for k, v in r.items() if k.startswith("tokens_seen.")}
        if mix:  # tokens seen per source of a data mixture
            parts.append("tokens " + " ".join(f"{name} {_short(v)}" for name, v in mix.items()))
        if "mfu" in r:
            parts.append(f"mfu {100 * r['mfu']:.1f}% (full-square attention {100 * r['mfu_full_attention']:.1f}%)")
        return " | ".join(parts)

    def _emit(self, record: dict[str, float], line: str) -> None:
        if not self.is_rank0:
            return
        print(line, flush=True)
        try:
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        except OSError as exc:  # a failed write() names no file; the message must (e.g. disk full)
            raise OSError(exc.errno, exc.strerror, str(self.path)) from exc
        if self._wandb is not None:
            self._wandb.log(record, step=int(record["step"]))
        if self._tensorboard is not None:
            self._tensorboard.write(record)

    def close(self) -> None:
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def _short(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


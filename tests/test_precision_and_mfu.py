"""Compute dtype, autocast, the GPU peak table and the MFU the metrics report; CPU-checkable parts
of the CUDA paths (the device name and dtype choice are simulated, the arithmetic is real)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from titan_core.observability.metrics import peak_flops
from titan_core.parallel.precision import autocast_for, resolve_compute_dtype

from conftest import trained

CUDA = torch.device("cuda", 0)  # a device object only: nothing here touches a GPU
CPU = torch.device("cpu")


def test_auto_dtype_is_bfloat16_on_cuda_and_float32_on_cpu() -> None:
    assert resolve_compute_dtype("auto", CUDA) == torch.bfloat16
    assert resolve_compute_dtype("auto", CPU) == torch.float32
    assert resolve_compute_dtype("float32", CUDA) == torch.float32
    assert resolve_compute_dtype("bfloat16", CPU) == torch.bfloat16


def test_autocast_runs_matmuls_in_the_compute_dtype_only_when_asked() -> None:
    a, b = torch.randn(4, 8), torch.randn(8, 2)
    with autocast_for(CPU, torch.bfloat16):
        assert (a @ b).dtype == torch.bfloat16
    with autocast_for(CPU, torch.float32):
        assert (a @ b).dtype == torch.float32


@pytest.mark.parametrize(
    ("name", "tflops"),
    [
        ("NVIDIA H200", 989.0),
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA H200 NVL", 835.0),
        ("NVIDIA GH200 480GB", 989.0),
        ("NVIDIA B200", 2250.0),
        ("NVIDIA GB200", 2500.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA L40S", 362.0),
        ("NVIDIA L40", 181.0),
        ("NVIDIA L4", 121.0),
    ],
)
def test_peak_table_takes_the_longest_matching_gpu_name(monkeypatch: pytest.MonkeyPatch, name: str,
                                                        tflops: float) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert peak_flops(CUDA, None) == tflops * 1e12
    assert peak_flops(CUDA, 100.0) == 100e12  # metrics.peak_tflops wins over the table


def test_unknown_gpu_and_cpu_have_no_peak_unless_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some Future Accelerator")
    assert peak_flops(CUDA, None) is None
    assert peak_flops(CPU, None) is None
    assert peak_flops(CPU, 0.25) == 0.25e12


def test_mfu_is_model_flops_per_second_over_the_peak(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from titan_llama.model import flops_per_token

    trainer, _ = trained(tmp_path, "training.steps=2", "metrics.peak_tflops=0.5")
    fpt = flops_per_token(trainer.model_args, 64)  # causal attention counted as computed
    full = flops_per_token(trainer.model_args, 64, full_attention=True)
    assert fpt < full
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["tokens_per_s"] == pytest.approx(4 * 64 / r["step_time_s"], rel=1e-9)
        assert r["tflops"] == pytest.approx(fpt * r["tokens_per_s"] / 1e12, rel=1e-9)
        assert r["mfu"] == pytest.approx(fpt * r["tokens_per_s"] / 0.5e12, rel=1e-9)
        assert r["mfu_full_attention"] == pytest.approx(full * r["tokens_per_s"] / 0.5e12, rel=1e-9)
        assert 0 < r["mfu"] < r["mfu_full_attention"]
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    last = records[-1]
    assert f"mfu {100 * last['mfu']:.1f}% (full-square attention {100 * last['mfu_full_attention']:.1f}%)" in lines[-1]


def test_no_mfu_on_cpu_without_a_configured_peak(tmp_path: Path) -> None:
    trained(tmp_path, "training.steps=1")
    (record,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert "mfu" not in record and record["tflops"] > 0


def test_bfloat16_autocast_trains_close_to_float32_with_float32_weights(tmp_path: Path) -> None:
    fp32_trainer, fp32 = trained(tmp_path / "fp32", "training.steps=3")
    bf16_trainer, bf16 = trained(tmp_path / "bf16", "training.steps=3", "training.dtype=bfloat16")
    assert fp32_trainer.compute_dtype == torch.float32 and bf16_trainer.compute_dtype == torch.bfloat16
    assert bf16 != fp32  # the matmuls really ran in bfloat16
    for a, b in zip(fp32, bf16):
        assert abs(a - b) <= 0.02 * a, (fp32, bf16)
    # mixed precision, not a bfloat16 model: parameters and optimizer state stay float32
    assert {p.dtype for p in bf16_trainer.model_parts[0].parameters()} == {torch.float32}
    moments = [v for opt in bf16_trainer.optimizer.optimizers for s in opt.state.values()
               for k, v in s.items() if k in ("exp_avg", "exp_avg_sq")]
    assert moments and {m.dtype for m in moments} == {torch.float32}

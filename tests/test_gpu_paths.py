"""CUDA paths that must do what they claim, checked here on their logic (issue 29, point 3).

The experts' dtype and path, deterministic set-up, fused AdamW on mixed DTensor and plain
parameters, the selective-AC kernels, device-time profiler phases, the peak-memory reset,
and a CUDA request on a machine without CUDA. (Host reads per step: test_host_reads.py;
the peak-FLOPs table: test_precision_and_mfu.py.)
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from torch import nn

from titan_core.config.sections import ActivationCheckpointSection, ProfilingSection
from titan_core.moe import MoE, MoEMonitor, experts as experts_module
from titan_core.moe.layer import tokens_per_expert
from titan_core.observability.metrics import reset_peak_memory
from titan_core.observability.profiling import DeviceRange, StepProfiler, device_phase_ms
from titan_core.parallel.checkpointing import KERNEL_SAVE_OPS, selective_save_ops
from titan_core.runtime.determinism import CUBLAS_ENV, enable_deterministic

from conftest import CliResult, assert_user_error


def test_experts_run_in_the_autocast_dtype_and_the_metrics_name_their_path(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    moe = MoE(16, 8, num_experts=4, top_k=2, norm_topk_prob=True)
    for w in (moe.experts.w1, moe.experts.w2, moe.experts.w3):
        nn.init.normal_(w, std=0.1)
    seen: list[tuple[torch.dtype, torch.dtype]] = []
    grouped_linear = experts_module.grouped_linear

    def spy(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        seen.append((x.dtype, weight.dtype))
        return grouped_linear(x, weight, counts)

    monkeypatch.setattr(experts_module, "grouped_linear", spy)
    monitor = MoEMonitor([moe])
    x = torch.randn(2, 5, 16)
    moe(x)  # float32, widths of 16-byte rows: torch._grouped_mm on a CPU
    monitor.after_forward()
    assert seen == [(torch.float32, torch.float32)] * 3
    assert monitor.after_step() == {"moe_load_imbalance": pytest.approx(monitor.metrics["moe_load_imbalance"]),
                                    "moe_load_imbalance_max": monitor.metrics["moe_load_imbalance_max"],
                                    "moe_grouped_mm": 1.0}
    seen.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = moe(x)
    # Tokens and weights both cast (autocast leaves grouped GEMMs alone); bfloat16 on a CPU takes the loop.
    assert seen == [(torch.bfloat16, torch.bfloat16)] * 3 and moe.experts.last_path == "loop"
    assert out.dtype == torch.float32  # combined back in the input's dtype
    monitor.after_forward()
    assert monitor.after_step()["moe_grouped_mm"] == 0.0


def test_token_counts_match_bincount_and_need_no_nondeterministic_kernel() -> None:
    choices = torch.tensor([3, 0, 3, 1, 3, 0, 5])
    torch.use_deterministic_algorithms(True)
    try:
        counts = tokens_per_expert(choices.sort().values, 6)
    finally:
        torch.use_deterministic_algorithms(False)
    assert counts.tolist() == torch.bincount(choices, minlength=6).tolist() == [2, 1, 0, 3, 0, 1]


def test_deterministic_sets_cublas_workspace_and_keeps_a_users_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CUBLAS_ENV, raising=False)
    try:
        message = enable_deterministic()
        assert os.environ[CUBLAS_ENV] == ":4096:8" and torch.are_deterministic_algorithms_enabled()
        assert "CUBLAS_WORKSPACE_CONFIG=:4096:8;" in message and "bincount" in message
        monkeypatch.setenv(CUBLAS_ENV, ":16:8")
        assert "CUBLAS_WORKSPACE_CONFIG=:16:8 (yours, kept)" in enable_deterministic()
    finally:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.benchmark = False


def test_fused_adamw_on_mixed_dtensor_and_plain_parameters_falls_back_and_says_so(
        tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    from titan_core.config.sections import OptimizerSection
    from titan_core.optim.containers import OptimizersContainer

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
        mesh = init_device_mesh("cpu", (1,))
        model[0].weight = nn.Parameter(distribute_tensor(model[0].weight.detach(), mesh, [Replicate()]))
        model[0].bias = nn.Parameter(distribute_tensor(model[0].bias.detach(), mesh, [Replicate()]))
        for impl in ("fused", "foreach"):
            opt = OptimizersContainer([model], OptimizerSection(implementation=impl), device_type="cpu")
            before = model[1].weight.detach().clone()
            out = model[0](distribute_tensor(torch.randn(2, 4), mesh, [Replicate()])).full_tensor()
            model[1](out).square().sum().backward()
            opt.step()  # torch's fused kernel would raise "got mixed torch.Tensor and DTensor"
            assert not torch.equal(before, model[1].weight)
            assert f"the {impl} AdamW kernels cannot take DTensor and plain parameters" in capsys.readouterr().err
        plain_fused = torch.optim.AdamW(model.parameters(), fused=True)
        with pytest.raises(RuntimeError, match="mixed torch.Tensor and DTensor"):
            plain_fused.step()  # what the container used to build
    finally:
        dist.destroy_process_group()


def test_selective_ac_keeps_the_accelerator_kernels_this_torch_has() -> None:
    ops = selective_save_ops(ActivationCheckpointSection(mode="selective"), ["aten.mm.default"])
    assert ops[0] is torch.ops.aten.mm.default
    names = {str(op) for op in ops}
    for name in KERNEL_SAVE_OPS:
        namespace, op, *overload = name.split(".")
        if hasattr(getattr(torch.ops, namespace), op):  # every one of them in torch 2.11-2.13
            assert any(op in n for n in names), (name, names)
    assert hasattr(torch.ops.aten, "_grouped_mm") and hasattr(torch.ops.aten, "_scaled_mm")
    # A list in the config is used as written.
    own = ActivationCheckpointSection(mode="selective", selective_save_ops=["aten.mm.default"])
    assert selective_save_ops(own, ["aten.addmm.default"]) == [torch.ops.aten.mm.default]


class FakeEvent:
    clock = 0.0

    def record(self) -> None:
        FakeEvent.clock += 1.5
        self.at = FakeEvent.clock

    def elapsed_time(self, end: FakeEvent) -> float:
        return end.at - self.at


def test_profiler_phases_on_cuda_are_read_from_device_events(tmp_path: Any) -> None:
    ranges: list[tuple[str, Any, Any]] = []
    for _ in range(2):  # two steps
        for phase in ("forward", "backward"):
            with DeviceRange(phase, ranges, FakeEvent):
                pass
    assert [name for name, _, _ in ranges] == ["forward", "backward"] * 2
    assert device_phase_ms(ranges, steps=2) == {"forward": 1.5, "backward": 1.5}
    # While profiling on CUDA, the compute phases take device events; waiting for data stays host time.
    profiler = StepProfiler(ProfilingSection(), run_dir=tmp_path, rank=0, device=torch.device("cuda"), is_rank0=True)
    profiler._prof = object()  # a window is open
    assert [type(profiler.phase(p)) is DeviceRange for p in ("forward", "backward", "optimizer", "data")] == \
        [True, True, True, False]


def test_peak_memory_is_reset_on_cuda_only(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", calls.append)
    reset_peak_memory(torch.device("cpu"))
    reset_peak_memory(torch.device("cuda", 0))
    assert calls == [torch.device("cuda", 0)]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_generate_on_cuda_without_cuda_is_one_message_exit_2(tmp_path: Any,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from titan_core.commands.generate import main

    code = main([str(tmp_path), "--prompt", "a", "--device", "cuda"])  # refused before the folder is read
    captured = capsys.readouterr()
    assert_user_error(CliResult(code, captured.out, captured.err),
                      "--device cuda: this torch sees no CUDA device", "Use --device cpu.")
